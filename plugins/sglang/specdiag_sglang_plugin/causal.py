"""A causal draft block in SGLang's flattened custom-mask layout: how the plugin serves DFLASH's verify.

DFLASH (SGLang 0.5.17 ``--speculative-algorithm DFLASH``) verifies one linear block of ``block_size`` tokens: its
target-verify calls pass no custom mask (``forward_metadata.custom_mask`` is None) and SGLang's own kernel then attends
causally inside the block (``extend_attention_fwd(..., is_causal=True)`` with no mask), the prefix fully visible. The
plugin's kernels read a tree mask in SGLang's layout instead: request b's row t at ``mask_indptr[b] + t * (P + T)``,
its column ``P + j`` saying whether draft token t sees draft token j (the prefix columns are never read). SGLang still
computes ``mask_indptr`` for such calls (``cumsum(T * (seq_lens + T))``, triton_backend.py), so a causal block is that
layout with ``[t, P + j] = j <= t``.

:class:`CausalMask` writes exactly those T x T entries per request into one buffer per process, with device ops only
(no host sync): CUDA-graph safe, so a captured verify graph replays the write with the replay's prefix lengths. The
buffer holds the largest ``mask_indptr[-1]`` the pool allows (``T x (slots + 2 x requests x (T + 1))`` bytes: 21 MB
for 1.25M slots at T = 16), allocated once. The entries depend only on the batch's indptrs, the same in every layer,
so they are written once per forward (the first layer's call; the forward batch is held by a weak reference, so a new
batch at a reused address is never mistaken for the old one), not once per layer.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

import torch


def causal_positions(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, mask_indptr: torch.Tensor,
                     draft: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat indices, values): the T x T draft entries of every request's causal block in SGLang's mask layout.

    Request b (``bs = len(qo_indptr) - 1`` requests, each ``draft`` tokens) with P = ``kv_indptr[b+1] - kv_indptr[b]``
    prefix tokens: index ``mask_indptr[b] + t * (P + T) + P + j``, value ``j <= t``. Device ops only.
    """
    bs = int(qo_indptr.shape[0]) - 1
    dev = mask_indptr.device
    prefix = (kv_indptr[1:bs + 1] - kv_indptr[:bs]).to(torch.int64)
    t = torch.arange(draft, device=dev, dtype=torch.int64)
    start = mask_indptr[:bs].to(torch.int64) + prefix
    idx = start[:, None, None] + t[None, :, None] * (prefix + draft)[:, None, None] + t[None, None, :]
    vals = (t[None, :] <= t[:, None]).to(torch.uint8).expand(bs, draft, draft)
    return idx.reshape(-1), vals.reshape(-1)


def capacity(slots: int, max_requests: int, draft: int) -> int:
    """Mask bytes the largest batch can index: T x (every pool slot in some prefix + each request's block), with each
    request's prefix padded by one more block (CUDA-graph padding rows carry a short fake prefix)."""
    return draft * (slots + 2 * max_requests * (draft + 1))


class CausalMask:
    """One process's causal-mask buffer and the forward it was last written for (module doc)."""

    def __init__(self) -> None:
        self.buf: Optional[torch.Tensor] = None
        self.draft = 0
        self._written_for: Any = None  # (weakref to the forward batch, capturing) of the last write

    def for_call(self, forward_batch: Any, meta: Any, draft: int, slots: int, max_requests: int) -> torch.Tensor:
        """The mask tensor for this verify call, its entries written on the batch's first call (uint8)."""
        need = capacity(slots, max_requests, draft)
        dev = meta.mask_indptr.device
        if self.buf is None or self.buf.numel() < need or self.buf.device != dev or self.draft != draft:
            self.buf = torch.zeros(need, dtype=torch.uint8, device=dev)
            self.draft = draft
            self._written_for = None
        capturing = bool(dev.type == "cuda" and torch.cuda.is_current_stream_capturing())
        last = self._written_for
        if last is None or last[0]() is not forward_batch or last[1] != capturing:
            idx, vals = causal_positions(meta.qo_indptr, meta.kv_indptr, meta.mask_indptr, draft)
            self.buf[idx.clamp_(0, self.buf.numel() - 1)] = vals
            try:
                ref = weakref.ref(forward_batch)
            except TypeError:  # an object without weak references: write on every call instead
                ref = lambda: None  # noqa: E731
            self._written_for = (ref, capturing)
        return self.buf
