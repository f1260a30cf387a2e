"""Pure functions between SGLang's verify call and specdiag's split-KV kernel (no sglang import).

What SGLang 0.5.17 passes to ``extend_attention_fwd`` on a target-verify step of the Triton backend
(``TritonAttnBackend.forward_extend`` and ``init_forward_metadata``; checked in the source):

- ``q`` [tokens, H, 576]: the draft tokens' absorbed queries, request b's rows
  ``qo_indptr[b] .. qo_indptr[b+1]`` (T draft tokens each).
- ``k``, ``v`` [tokens, 1, 576] / [tokens, 1, 512]: the draft tokens' latent rows (``v`` = the first
  512 dims of ``k``: DeepSeek's forward_absorb_core passes ``cat(k_nope, k_pe)`` and ``k_nope``).
- the layer's latent cache ``k_buffer`` [slots, 1, 576] (value buffer: its first 512 dims, a view);
  request b's prefix (its P committed tokens) is ``kv_indices[kv_indptr[b] .. kv_indptr[b+1]]``,
  page_size 1 slots.
- ``custom_mask``: flattened; request b's block starts at ``mask_indptr[b]`` and holds T rows of
  ``P + T`` entries; entry ``[t, P + j]`` says whether draft token t sees draft token j. SGLang's
  kernel skips the prefix columns (``skip_prefix_custom_mask=True``): the prefix is fully visible.
- ``layer.scaling`` (softmax scale) and ``logit_cap`` (tanh cap on the scaled scores, 0 = none).
- an fp8 cache (``--kv-cache-dtype fp8_e4m3``): ``get_key_buffer`` returns the pool viewed as float8_e4m3fn (stored
  as uint8); ``forward_extend`` stores the draft rows as ``k.to(fp8)``, or ``(k / k_scale).to(fp8)`` when the layer
  has a ``k_scale`` (a checkpoint's calibrated scales), and its kernel multiplies the scores by ``k_scale`` and P V by
  ``v_scale``: for the one latent buffer that is the dequantized cache only when the two are equal. SGLang's kernel
  reads the draft block from the bf16 ``k``/``v`` and casts q and P to fp8 for the prefix's dots
  (``tl.dot(q.to(k.dtype), k)``); the plugin's fp8 kernel reads every row from the cache, draft rows included,
  converts them exactly to fp16 and keeps q in fp16 (``fp8_reference`` is what it computes).

This module holds the plugin's decision (serve or fall back, and why), the per-request view of
such a batch as specdiag's :class:`VerifyInputs`, and the torch path that runs the kernel's CPU
fallback on it. The CUDA path (hook.py) hands the same tensors to the plugin's kernels directly
(gluon.ragged on sm_90, else triton.ragged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from specdiag.kernels.mla import D_QK, D_V, VerifyInputs
from specdiag.kernels.reference import split_kv_torch

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)


@dataclass
class VerifyBatch:
    """One verify-attention call in SGLang's layout (the tensors listed in the module docstring)."""

    q: torch.Tensor  #: [tokens, H, 576]
    k_ext: torch.Tensor  #: [tokens, 1, 576] draft keys (latent rows)
    v_ext: torch.Tensor  #: [tokens, 1, 512] draft values
    kv_buffer: torch.Tensor  #: [slots, 1, 576] latent cache of the layer
    qo_indptr: torch.Tensor  #: [bs + 1]
    kv_indptr: torch.Tensor  #: [bs + 1]
    kv_indices: torch.Tensor  #: [>= kv_indptr[-1]] int64 slots
    custom_mask: torch.Tensor  #: flattened bool/uint8
    mask_indptr: torch.Tensor  #: [bs + 1]
    sm_scale: float
    logit_cap: float = 0.0

    @property
    def batch_size(self) -> int:
        return int(self.qo_indptr.shape[0]) - 1


@dataclass(frozen=True)
class CallFacts:
    """What the plugin looks at to decide, all read without touching tensor values (graph-safe).

    forward_mode_verify: the batch is a target-verify step
    page_size:           the backend's page size
    use_mla:             the model's attention is MLA (one latent KV head)
    qk_head_dim, v_head_dim: the layer's head dims (576 and 512 for DeepSeek-V3 MLA)
    has_kv_tensors:      k and v were passed (not None)
    kv_scaled:           the layer has k_scale/v_scale (an fp8 KV cache)
    sliding_window:      the layer uses a sliding window
    sinks, score_mod:    attention sinks or a score modifier were passed
    xai_temperature:     the layer uses xai temperature scaling
    dcp_size:            decode context parallel size
    deterministic:       the backend runs its deterministic (unified) kernel
    causal:              the layer is causal self-attention
    has_custom_mask:     a verify mask was passed (a tree: NGRAM, EAGLE)
    has_mask_indptr:     SGLang computed mask offsets (every target-verify call); with no mask the block is causal
                         (DFLASH's linear verify: SGLang's own kernel runs it with is_causal and no mask)
    q_dtype, kv_dtype:   tensor dtypes
    value_is_latent_view: the value buffer is the first 512 dims of the key buffer (same storage)
    is_cuda:             tensors are on a CUDA (not ROCm) device
    rows:                packed rows of the call (heads x the most draft tokens of a request)
    kv_scales_equal:     the layer's k_scale and v_scale are one number (or absent)
    """

    forward_mode_verify: bool
    page_size: int
    use_mla: bool
    qk_head_dim: int
    v_head_dim: int
    has_kv_tensors: bool
    kv_scaled: bool
    sliding_window: bool
    sinks: bool
    score_mod: bool
    xai_temperature: bool
    dcp_size: int
    deterministic: bool
    causal: bool
    has_custom_mask: bool
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    value_is_latent_view: bool
    is_cuda: bool
    rows: int = 0
    kv_scales_equal: bool = True
    has_mask_indptr: bool = True


def decide(facts: CallFacts) -> tuple[bool, str]:
    """(serve, reason): whether the split-KV kernel serves this call, and why not when it does not.

    The order puts the common non-verify case first (every prefill and decode call lands there).
    """
    if not facts.forward_mode_verify:
        return False, "not a target-verify step"
    checks = [
        (facts.is_cuda, "not on a CUDA device"),
        (facts.use_mla, "not an MLA layer (the kernel covers the latent cache only)"),
        (facts.qk_head_dim == D_QK and facts.v_head_dim == D_V,
         f"head dims {facts.qk_head_dim}/{facts.v_head_dim}, the kernel needs {D_QK}/{D_V}"),
        (facts.page_size == 1, f"page_size {facts.page_size}, the kernel reads page_size 1 token indices"),
        (facts.has_kv_tensors, "k/v not passed (the draft block's latent rows are needed)"),
        (not facts.sliding_window, "sliding-window attention not supported"),
        (not facts.sinks, "attention sinks not supported"),
        (not facts.score_mod, "score_mod not supported"),
        (not facts.xai_temperature, "xai temperature scaling not supported"),
        (facts.dcp_size == 1, f"decode context parallel (dcp_size {facts.dcp_size}) not supported"),
        (not facts.deterministic, "deterministic mode (the backend's unified kernel) kept"),
        (facts.causal, "non-causal attention"),
        (facts.has_custom_mask or facts.has_mask_indptr,
         "no custom mask and no mask_indptr passed (neither a tree nor a linear verify block)"),
        (facts.value_is_latent_view, "the value buffer is not the first 512 dims of the latent key buffer"),
    ]
    if facts.kv_dtype == torch.float8_e4m3fn:
        checks += [
            (facts.q_dtype == torch.bfloat16, f"fp8 KV cache with q {facts.q_dtype}: the fp8 kernel takes bf16 queries"),
            (facts.kv_scales_equal, "fp8 KV cache with k_scale != v_scale: the latent cache has one scale"),
        ]
    else:
        checks += [
            (not facts.kv_scaled, f"k_scale/v_scale on a {facts.kv_dtype} KV cache not supported"),
            (facts.q_dtype in SUPPORTED_DTYPES and facts.kv_dtype == facts.q_dtype,
             f"dtypes q {facts.q_dtype} / kv {facts.kv_dtype}, the kernel needs both bf16 or both fp16, or bf16 q "
             "and a float8_e4m3fn cache"),
        ]
    for ok, reason in checks:
        if not ok:
            return False, reason
    block = ("custom mask" if facts.has_custom_mask
             else "causal draft block: a linear verify with no custom mask, as DFLASH's")
    if facts.kv_dtype == torch.float8_e4m3fn:
        return True, f"split-KV verify (MLA latent, page_size 1, {block}, fp8 e4m3 cache)"
    return True, f"split-KV verify (MLA latent, page_size 1, {block})"


def tree_mask(batch: VerifyBatch, b: int) -> torch.Tensor:
    """Request b's [T, T] draft mask from the flattened custom mask (entries [t, P + j])."""
    q0, q1 = int(batch.qo_indptr[b]), int(batch.qo_indptr[b + 1])
    p = int(batch.kv_indptr[b + 1]) - int(batch.kv_indptr[b])
    t = q1 - q0
    start = int(batch.mask_indptr[b])
    block = batch.custom_mask[start:start + t * (p + t)].reshape(t, p + t)
    return block[:, p:].to(torch.bool)


def request_inputs(batch: VerifyBatch, b: int, draft_loc: Optional[torch.Tensor] = None,
                   kv_scale: float = 1.0) -> VerifyInputs:
    """Request b as specdiag's VerifyInputs: a pool of its prefix rows then its draft rows, in order.

    Without ``draft_loc`` the draft rows are the call's k (bf16); the draft values must be the first 512 dims of the
    draft keys (true for MLA), checked here, since VerifyInputs reads values from the latent rows. With ``draft_loc``
    (an fp8 pool: what the plugin's fp8 kernel reads) every row comes from the cache, the draft tokens' at their slots
    where SGLang stored them, as fp32 e4m3 x ``kv_scale``.
    """
    q0, q1 = int(batch.qo_indptr[b]), int(batch.qo_indptr[b + 1])
    k0, k1 = int(batch.kv_indptr[b]), int(batch.kv_indptr[b + 1])
    cache = batch.kv_buffer.reshape(batch.kv_buffer.shape[0], D_QK)
    if draft_loc is None:
        k_draft = batch.k_ext[q0:q1].reshape(q1 - q0, D_QK)
        if not torch.equal(batch.v_ext[q0:q1].reshape(q1 - q0, D_V), k_draft[:, :D_V]):
            raise ValueError("draft values differ from the first 512 dims of the draft keys: not an MLA latent call")
        pool = torch.cat([cache[batch.kv_indices[k0:k1]], k_draft], dim=0)
    else:
        if cache.dtype != torch.float8_e4m3fn:
            raise ValueError(f"draft rows from the cache: the fp8 path reads a float8_e4m3fn cache; got {cache.dtype}")
        rows = torch.cat([batch.kv_indices[k0:k1].long(), draft_loc[q0:q1].long()])
        pool = cache.view(torch.uint8)[rows].view(torch.float8_e4m3fn).float() * kv_scale  # bytes: any device
    token_table = torch.arange(pool.shape[0], dtype=torch.int64, device=pool.device)
    return VerifyInputs(q=batch.q[q0:q1], cache=pool, token_table=token_table, block_table=None,
                        mask=tree_mask(batch, b), n_prefix=k1 - k0, sm_scale=batch.sm_scale)


def fp8_reference(batch: VerifyBatch, draft_loc: torch.Tensor, kv_scale: float) -> torch.Tensor:
    """[tokens, H, 512] fp32: what the plugin's fp8 kernel computes, exactly: every row from the fp8 pool
    (``request_inputs`` with ``draft_loc``) in fp32 (specdiag.kernels.reference.reference_verify), the draft block under
    the tree mask."""
    from specdiag.kernels.reference import reference_verify  # noqa: PLC0415

    out = torch.empty(batch.q.shape[0], batch.q.shape[1], D_V, dtype=torch.float32, device=batch.q.device)
    for b in range(batch.batch_size):
        q0, q1 = int(batch.qo_indptr[b]), int(batch.qo_indptr[b + 1])
        out[q0:q1] = reference_verify(request_inputs(batch, b, draft_loc, kv_scale))
    return out


def run_torch(batch: VerifyBatch, out: torch.Tensor, n_splits: int = 4) -> torch.Tensor:
    """The kernel's torch fallback over the batch, request by request; fills ``out`` [tokens, H, 512]."""
    if batch.logit_cap and batch.logit_cap > 0:
        raise ValueError("the torch fallback has no logit cap; the CUDA kernel does")
    for b in range(batch.batch_size):
        q0, q1 = int(batch.qo_indptr[b]), int(batch.qo_indptr[b + 1])
        inputs = request_inputs(batch, b)
        res = inputs.out_like()
        split_kv_torch(inputs, res, n_splits=n_splits)
        out[q0:q1] = res.to(out.dtype)
    return out


def max_draft_tokens(max_extend_len: Optional[int], q_tokens: int, batch_size: int) -> int:
    """Draft tokens per request that the row tiles must cover: SGLang's max_extend_len, else tokens / bs."""
    if max_extend_len:
        return int(max_extend_len)
    return -(-q_tokens // max(1, batch_size))
