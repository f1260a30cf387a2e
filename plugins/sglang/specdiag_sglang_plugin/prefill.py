"""Prefill on a pure Triton server: long prompts' chunks in the MHA form, on specdiag's ragged flash-attention kernel.

Why: SGLang 0.5.17's Triton backend runs a chunked prefill's first chunk in the MHA form and every later chunk (one
with a prefix) in the absorbed form (``handle_attention_triton``), 2,176 FLOP per query-key pair and head against 640,
through ``extend_attention_fwd``; and its chunked-prefix MHA path (``MHA_CHUNKED_KV``) is gated on
``--attention-backend`` being one of FlashInfer, FA3, ... (``maybe_disable_chunked_prefix_cache``). FlashInfer's
prefill is the fast one where it is installed; this path is for servers without it (builds without FlashInfer, GPUs
where its MLA prefill does not run).

What it does (``SPECDIAG_SGLANG_PREFILL=mha``; off unless asked, like the verify path):

1. At registration, ``triton`` joins SGLang's list of backends that read the chunked prefix-cache layout
   (``server_args.add_chunked_prefix_cache_attention_backend``, SGLang's own hook for out-of-tree backends).
2. An AROUND hook on ``DeepseekV2AttentionMLA.dispatch_attn_forward_method`` turns SGLang's absorbed choice into
   ``MHA_CHUNKED_KV`` for a Triton-backend extend (no speculation) whose prefix is at least
   ``chunked_prefix_cache_threshold`` tokens (SGLang's ``SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD``, 8,192), where this
   kernel can serve (:func:`serves`); SGLang then decompresses each prefix chunk and calls the backend per part.
3. The Triton backend's ``forward_extend`` (hook.py's AROUND hook) sends those MHA calls here (:func:`mha_call`):
   the chunk itself causal, each prefix chunk with no mask, each with its log-sum-exp in SGLang's convention (natural
   log, [tokens, heads] float32) so SGLang's ``merge_state_v2`` joins them; a first chunk (no prefix) causal too.

Where it cannot serve (an fp8 KV cache, a logit cap, not CUDA, prefill CUDA graphs, dcp) SGLang's choice stands and
one log line says why. ``SPECDIAG_SGLANG_CHECK=1`` checks every served call against the fp32 reference on a sample of
its query rows (STATS ``prefill_check``).
"""

from __future__ import annotations

import functools
import os
from collections import Counter

import torch

from specdiag_sglang_plugin.logs import log_once

PREFILL_ENV = "SPECDIAG_SGLANG_PREFILL"
#: the kernel's configuration (``block_m:block_n:warps:stages[:tma]``; 06's prefill cases print the fastest on a
#: GPU: ``python -m specdiag.steps.kernel_ab.prefill --out RUN --best``); unset: the kernel's default
CONFIG_ENV = "SPECDIAG_SGLANG_PREFILL_CONFIG"
PREFILL_MODES = ("off", "mha")
DISPATCH = "sglang.srt.models.deepseek_v2.DeepseekV2AttentionMLA.dispatch_attn_forward_method"
CHECK_ROWS = 64  #: query rows per served call that check mode compares with the fp32 reference

PROBE_REL_ERR = 2e-2  #: the probe's tolerance against the fp32 reference (bf16 inputs; served calls reach ~2e-3)

#: calls served (all layers): "own_chunk" the chunk's causal part, "prefix_chunk" a prefix chunk, "no_prefix" a first
#: chunk; "declined" the reasons SGLang's absorbed form stayed; "check" check mode's rows; "probe" per "device dtype"
#: the kernel's probe: "" where it ran and matched the reference, else why it cannot serve here
STATS: dict = {"served": Counter(), "declined": Counter(), "check": [], "probe": {}}


def prefill_from_env(environ=os.environ) -> str:
    value = environ.get(PREFILL_ENV, "off").strip().lower() or "off"
    if value not in PREFILL_MODES:
        raise ValueError(f"{PREFILL_ENV}={value!r}: use mha (long prompts' chunks on specdiag's MHA prefill kernel) or "
                         "off (SGLang's own prefill, the default)")
    return value


@functools.lru_cache(maxsize=4)
def _parse(text: str):
    from specdiag.kernels.triton.prefill import parse_config  # noqa: PLC0415  (imports triton)

    return parse_config(text)


def config_from_env(environ=os.environ):
    """The kernel configuration ``SPECDIAG_SGLANG_PREFILL_CONFIG`` names, or None for the kernel's default; a bad
    value raises ValueError naming the variable and the form."""
    text = environ.get(CONFIG_ENV, "").strip()
    if not text:
        return None
    try:
        return _parse(text)
    except ValueError as exc:
        raise ValueError(f"{CONFIG_ENV}: {exc}") from None


def serves(attn, forward_batch) -> tuple[bool, str]:
    """Whether this kernel can take an MHA-form chunk of ``attn`` (a DeepseekV2AttentionMLA) here, and why not."""
    if getattr(attn, "disable_chunked_prefix_cache", True):
        return False, "SGLang's chunked prefix cache is off for this layer (--disable-chunked-prefix-cache?)"
    if str(getattr(attn, "kv_cache_dtype", "auto")).startswith("fp8"):
        return False, f"KV cache {attn.kv_cache_dtype}: the MHA prefill path is checked on bf16/fp16 caches only"
    if getattr(attn.attn_mha, "logit_cap", 0) and attn.attn_mha.logit_cap > 0:
        return False, "logit cap (not in the prefill kernel)"
    if not torch.cuda.is_available() or torch.version.hip is not None:
        return False, "not a CUDA device"
    if getattr(forward_batch, "attn_dcp_metadata", None) is not None:
        return False, "decode context parallelism (dcp)"
    return True, ""


def kernel_ready(device, dtype) -> tuple[bool, str]:
    """Whether the kernel serves on ``device`` for ``dtype``: probed once (:func:`probe`) before the first call it would
    take, as a prefix chunk cannot go back to SGLang (its Triton backend has no MHA path with a prefix); False and why
    where the probe failed or a served call raised (:func:`mark_failed`). Not probed inside a CUDA-graph capture."""
    key = f"{device} {dtype}"
    if key not in STATS["probe"]:
        if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
            return False, "the prefill kernel is not yet probed (a CUDA-graph capture is running)"
        STATS["probe"][key] = probe(device, dtype)
        if STATS["probe"][key]:
            log_once("prefill-probe:" + key, "prefill kernel unusable on %s (%s): SGLang's prefill serves every chunk",
                     key, STATS["probe"][key])
    why = STATS["probe"][key]
    return not why, why


def mark_failed(device, dtype, exc: BaseException) -> None:
    """A served call raised: no later chunk on ``device``/``dtype`` is routed to the kernel."""
    STATS["probe"][f"{device} {dtype}"] = f"the kernel raised {type(exc).__name__} on a served call"


def probe(device, dtype, heads: int = 2, cfg=None) -> str:
    """Run the configured kernel once on a small ragged batch shaped as SGLang's calls are (q-k width 192, value 128,
    int64 ``qo_indptr``, int32 prefix-chunk offsets; a causal call and a prefix call with its lse) and compare it with
    the fp32 reference: "" where it matches, else why not (a compile error, a launch error, a wrong result)."""
    from specdiag.kernels.prefill import D_QK_MHA, D_V_MHA, prefill, reference  # noqa: PLC0415

    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(n, d):
        return torch.randn(n, heads, d, generator=gen).to(device=device, dtype=dtype)

    try:
        cfg = cfg if cfg is not None else config_from_env()
        cu_q = torch.tensor([0, 3, 133], dtype=torch.int64, device=device)
        for causal, cu_k in ((True, cu_q), (False, torch.tensor([0, 200, 270], dtype=torch.int32, device=device))):
            q, k, v = rand(133, D_QK_MHA), rand(int(cu_k[-1]), D_QK_MHA), rand(int(cu_k[-1]), D_V_MHA)
            o, lse = prefill(q, k, v, cu_q, cu_k, 130, causal, D_QK_MHA ** -0.5, return_lse=True, cfg=cfg)
            ref_o, ref_lse = reference(q, k, v, cu_q, cu_k, causal, D_QK_MHA ** -0.5)
            err = float((o.float() - ref_o).norm() / ref_o.norm().clamp_min(1e-30))
            lse_err = float((lse - ref_lse).abs().max())
            if not (err <= PROBE_REL_ERR and lse_err <= PROBE_REL_ERR):  # NaN fails too
                return (f"its probe ({'causal' if causal else 'prefix'} call) is off the fp32 reference: rel err "
                        f"{err:.3g}, lse err {lse_err:.3g}")
    except Exception as exc:  # noqa: BLE001  any failure means: not here
        first = (str(exc).strip().splitlines() or [""])[-1][:200]
        return f"its probe raised {type(exc).__name__}: {first}"
    return ""


def dispatch_hook(original, attn, forward_batch):
    """AROUND hook of dispatch_attn_forward_method: the absorbed choice for a long Triton chunk becomes MHA_CHUNKED_KV
    (module doc, 2.); everything else is SGLang's choice."""
    method = original(attn, forward_batch)
    if getattr(method, "name", "") != "MLA" or getattr(attn, "current_attention_backend", None) != "triton":
        return method
    mode = forward_batch.forward_mode
    if not mode.is_extend_without_speculative():
        return method
    prefix = sum(forward_batch.extend_prefix_lens_cpu or ())
    if prefix < attn.chunked_prefix_cache_threshold:
        return method
    from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import (  # noqa: PLC0415
        is_in_tc_piecewise_cuda_graph)

    if is_in_tc_piecewise_cuda_graph():
        why = "prefill CUDA graphs (the MHA chunks' shapes vary with the prefix)"
    else:
        ok, why = serves(attn, forward_batch)
        if ok:
            ok, why = kernel_ready(forward_batch.seq_lens.device, forward_batch.token_to_kv_pool.dtype)
        if ok:
            from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import (  # noqa: PLC0415
                AttnForwardMethod)

            log_once("prefill-mha", "prefill: chunks with a prefix of %d+ tokens run the MHA form (chunked prefix "
                     "cache) on specdiag's Triton flash-attention kernel instead of the absorbed form",
                     attn.chunked_prefix_cache_threshold)
            return AttnForwardMethod.MHA_CHUNKED_KV
    STATS["declined"][why] += 1
    log_once("prefill-declined:" + why, "prefill stays SGLang's (absorbed form for chunks with a prefix): %s", why)
    return method


def is_mha_call(backend, k, layer, forward_batch, save_kv_cache) -> bool:
    """A DeepSeek MHA-form call of the Triton backend: an extend without speculation on an MLA model whose k and v are
    given and not stored (attn_mha: as many k heads as q heads, q-k width 192, value width 128; the absorbed form's
    attn_mqa has one latent k head), either a part of the chunked-prefix path or a chunk with no prefix (SGLang's own
    MHA choice)."""
    if k is None or save_kv_cache or not getattr(backend, "use_mla", False) or layer.qk_head_dim == layer.v_head_dim:
        return False
    if layer.tp_k_head_num != layer.tp_q_head_num:
        return False
    if not forward_batch.forward_mode.is_extend_without_speculative():
        return False
    return forward_batch.attn_attend_prefix_cache is not None or not any(forward_batch.extend_prefix_lens_cpu or ())


def mha_call(backend, q, k, v, layer, forward_batch):
    """Serve one MHA-form call (module doc, 3.): returns what SGLang's FlashInfer backend returns for it, ``o``
    [n, H, 128] and the lse [n, H] where SGLang asked for one, else ``o`` [n, H x 128]."""
    from specdiag.kernels.prefill import prefill  # noqa: PLC0415

    heads, meta = layer.tp_q_head_num, backend.forward_metadata
    qv = q.view(-1, heads, layer.qk_head_dim)
    kv_heads = layer.tp_k_head_num
    kk = k.view(-1, kv_heads, layer.qk_head_dim)
    vv = v.view(-1, kv_heads, layer.v_head_dim)
    max_q = max(forward_batch.extend_seq_lens_cpu)
    attend_prefix = forward_batch.attn_attend_prefix_cache
    if attend_prefix:
        idx = forward_batch.prefix_chunk_idx
        cu_k, causal, want_lse = forward_batch.prefix_chunk_cu_seq_lens[idx], False, True
    else:
        cu_k, causal = meta.qo_indptr, True
        want_lse = bool(attend_prefix is not None and forward_batch.mha_return_lse)
    res = prefill(qv, kk, vv, meta.qo_indptr, cu_k, max_q, causal, layer.scaling, return_lse=want_lse,
                  cfg=config_from_env())
    STATS["served"]["prefix_chunk" if attend_prefix else "own_chunk" if attend_prefix is not None else "no_prefix"] += 1
    if os.environ.get("SPECDIAG_SGLANG_CHECK") == "1":
        _check(qv, kk, vv, meta.qo_indptr, cu_k, causal, layer, res, want_lse)
    if want_lse:
        return res
    return res.view(-1, heads * layer.v_head_dim)


def _check(q, k, v, cu_q, cu_k, causal, layer, res, want_lse) -> None:
    """Check mode: the served call against the fp32 reference on CHECK_ROWS query rows (the last of each request and
    a spread), its relative errors recorded."""
    from specdiag.kernels.prefill import reference  # noqa: PLC0415

    if len(STATS["check"]) >= 2000:
        return
    n = q.shape[0]
    rows = torch.unique(torch.cat([torch.linspace(0, n - 1, CHECK_ROWS // 2, device=q.device).long(),
                                   (cu_q[1:].long() - 1).clamp_min(0)]))
    ref_o, ref_lse = reference(q, k, v, cu_q, cu_k, causal, layer.scaling, rows=rows)
    o = res[0] if want_lse else res
    err = float((o[rows].float() - ref_o).norm() / ref_o.norm().clamp_min(1e-30))
    row = {"layer": int(layer.layer_id), "rows": int(n), "causal": causal, "prefix_chunk": not causal,
           "keys": int(cu_k[-1]), "rel_err": err}
    if want_lse:
        lse, fin = res[1][rows], torch.isfinite(ref_lse)
        row["lse_abs_err"] = float((lse[fin] - ref_lse[fin]).abs().max()) if fin.any() else 0.0
    STATS["check"].append(row)


def register_prefill(registry, hook_type) -> bool:
    """Register the dispatch hook and let the Triton backend read the chunked prefix-cache layout; False (and one log
    line) where this SGLang has no such hook point."""
    try:
        from sglang.srt.server_args import add_chunked_prefix_cache_attention_backend  # noqa: PLC0415
    except ImportError as exc:
        log_once("prefill-import", "%s=mha but this SGLang has no add_chunked_prefix_cache_attention_backend (%s): "
                 "prefill stays SGLang's", PREFILL_ENV, exc)
        return False
    try:
        cfg = config_from_env()
        if cfg is None:
            from specdiag.kernels.triton.prefill import DEFAULT_CONFIG as cfg  # noqa: PLC0415  (imports triton)
    except (ValueError, ImportError) as exc:
        log_once("prefill-config", "%s: prefill stays SGLang's", exc)
        return False
    add_chunked_prefix_cache_attention_backend("triton")
    registry.register(DISPATCH, dispatch_hook, hook_type.AROUND)
    log_once("prefill-registered", "%s=mha: a Triton server's long prompt chunks may run the MHA form on specdiag's "
             "prefill kernel (chunked prefix cache enabled for the triton backend; tiles %s)", PREFILL_ENV, cfg.spec)
    return True
