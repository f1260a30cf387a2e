"""The entry point: the verify kernel for a call on SGLang's ragged layout, chosen by the device and the cache's dtype,
and the call. What the SGLang plugin serves (plugins/sglang, ``hook.py``) and the kernel A/B's ``plugin`` arms time.

| device | KV cache | kernel (:func:`choose`) |
|---|---|---|
| CUDA sm_90 (Hopper) | bf16 or fp16 | ``"gluon"``: gluon.ragged ``ragged_split_kv_gluon_ws`` |
| CUDA sm_90 | fp8 e4m3 | ``"gluon_fp8"``: gluon.ragged ``ragged_split_kv_gluon_fp8`` |
| another CUDA GPU; or a logit cap, a non-contiguous q | bf16 or fp16 | ``"triton"``: triton.ragged |
| anything but sm_90; or a logit cap, a scale past fp16's | fp8 e4m3 | none: the caller's own kernel serves |

:func:`choose` reads only the tensors' attributes and imports no Triton, so a caller can decide (and say why) before it
stores anything; :func:`verify` launches the kernel it is told, or the one :func:`choose` names.
"""

from __future__ import annotations

from typing import Optional

import torch

from specdiag.kernels.mla import MAX_KV_SCALE

GLUON = "gluon"
GLUON_FP8 = "gluon_fp8"
TRITON = "triton"
KERNELS = (GLUON, GLUON_FP8, TRITON)


def _sm90(q: torch.Tensor) -> tuple[bool, str]:
    if not q.is_cuda or torch.version.hip is not None:
        return False, "not a CUDA device"
    if torch.cuda.get_device_capability(q.device) != (9, 0):
        return False, f"compute capability {torch.cuda.get_device_capability(q.device)}, the kernel is sm_90's (wgmma)"
    return True, ""


def gluon_supported(q: torch.Tensor, kv: torch.Tensor, logit_cap: float = 0.0) -> tuple[bool, str]:
    """(runs, why not): the Gluon kernel serves CUDA sm_90 (wgmma), bf16 or fp16 q and cache in one dtype, contiguous
    q, no logit cap."""
    ok, why = _sm90(q)
    if not ok:
        return False, why
    if q.dtype not in (torch.bfloat16, torch.float16) or kv.dtype != q.dtype:
        return False, f"dtypes q {q.dtype} / kv {kv.dtype}: needs both bf16 or both fp16"
    if not q.is_contiguous():
        return False, "q is not contiguous (a request's rows must be one block)"
    if logit_cap and logit_cap > 0:
        return False, "logit cap (the Triton ragged kernel has it)"
    return True, "warp-specialized Gluon kernel (sm_90)"


def gluon_fp8_supported(q: torch.Tensor, kv: torch.Tensor, kv_scale: float = 1.0,
                        logit_cap: float = 0.0) -> tuple[bool, str]:
    """(runs, why not) for an fp8 cache: CUDA sm_90, bf16 contiguous q, a float8_e4m3fn cache, a scale whose e4m3
    range fits fp16's, no logit cap (any row count)."""
    ok, why = _sm90(q)
    if not ok:
        return False, why
    if q.dtype != torch.bfloat16 or kv.dtype != torch.float8_e4m3fn:
        return False, f"dtypes q {q.dtype} / kv {kv.dtype}: the fp8 kernel takes bf16 q and a float8_e4m3fn cache"
    if not q.is_contiguous():
        return False, "q is not contiguous (a request's rows must be one block)"
    if not 0 < kv_scale <= MAX_KV_SCALE:
        return False, f"KV scale {kv_scale}: the fp8 kernel converts to fp16 and needs one in (0, {MAX_KV_SCALE:.1f}]"
    if logit_cap and logit_cap > 0:
        return False, "logit cap (not in the fp8 kernel)"
    return True, "warp-specialized Gluon fp8 kernel (sm_90)"


def choose(q: torch.Tensor, kv: torch.Tensor, kv_scale: float = 1.0, logit_cap: float = 0.0,
           gluon: bool = True) -> tuple[Optional[str], str]:
    """(the kernel of ``KERNELS`` that serves a call with queries ``q`` and cache ``kv``, why) by the module doc's
    table; (None, why) where none here can (an fp8 cache off sm_90). ``gluon`` False: the Triton kernel only (on an
    fp8 cache, none)."""
    if kv.dtype == torch.float8_e4m3fn:
        if not gluon:
            return None, "the Gluon kernels are off (the fp8 kernel is a Gluon one)"
        ok, why = gluon_fp8_supported(q, kv, kv_scale, logit_cap)
        return (GLUON_FP8 if ok else None), why
    if not gluon:
        return TRITON, "the Gluon kernels are off"
    ok, why = gluon_supported(q, kv, logit_cap)
    return (GLUON if ok else TRITON), why


def verify(q: torch.Tensor, kv: torch.Tensor, o: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
           kv_indices: torch.Tensor, mask: torch.Tensor, mask_indptr: torch.Tensor, max_draft: int, sm_scale: float,
           draft_loc: Optional[torch.Tensor] = None, k_ext: Optional[torch.Tensor] = None, kv_scale: float = 1.0,
           logit_cap: float = 0.0, cfg=None, num_sms: Optional[int] = None,
           kernel: Optional[str] = None) -> torch.Tensor:
    """Verify attention for a batch in SGLang's layout into ``o`` [tokens, H, 512] (returned) with ``kernel`` (one of
    ``KERNELS``; None: :func:`choose`'s, a ValueError where none serves). ``q`` [tokens, H, 576]; ``kv`` the layer's
    latent cache [slots, (1,) 576]; the request's prefix slots ``kv_indices[kv_indptr[b] ..]``; ``mask`` SGLang's
    flattened custom mask; ``max_draft`` the most draft tokens of a request. The Gluon kernels read the draft rows from
    the cache at ``draft_loc`` (SGLang's out_cache_loc: stored there before the call), the Triton kernel from ``k_ext``
    [tokens, (1,) 576]. ``kv_scale``: an fp8 cache's scale; ``cfg``: the kernel's SplitKVConfig (None: its own). No
    host synchronisation: safe under CUDA-graph capture."""
    if kernel is None:
        kernel, why = choose(q, kv, kv_scale, logit_cap)
        if kernel is None:
            raise ValueError(f"no verify kernel here serves this call: {why}")
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}; got {kernel!r}")
    if kernel in (GLUON, GLUON_FP8):
        if draft_loc is None:
            raise ValueError(f"the {kernel} kernel reads the draft rows from the cache: pass draft_loc")
        if logit_cap and logit_cap > 0:
            raise ValueError(f"the {kernel} kernel has no logit cap: use {TRITON!r}")
    args = (q, kv, o, qo_indptr, kv_indptr, kv_indices)
    common = dict(max_draft=max_draft, sm_scale=sm_scale, cfg=cfg, num_sms=num_sms)
    if kernel == GLUON_FP8:
        from specdiag.kernels.gluon.ragged import ragged_split_kv_gluon_fp8  # noqa: PLC0415

        return ragged_split_kv_gluon_fp8(*args, draft_loc, mask, mask_indptr, kv_scale=kv_scale, **common)
    if kernel == GLUON:
        from specdiag.kernels.gluon.ragged import ragged_split_kv_gluon_ws  # noqa: PLC0415

        return ragged_split_kv_gluon_ws(*args, draft_loc, mask, mask_indptr, **common)
    if k_ext is None:
        raise ValueError("the triton kernel reads the draft rows from k_ext: pass it")
    from specdiag.kernels.triton.ragged import ragged_split_kv_triton  # noqa: PLC0415

    return ragged_split_kv_triton(q, k_ext, kv, o, qo_indptr, kv_indptr, kv_indices, mask, mask_indptr,
                                  logit_cap=logit_cap, **common)
