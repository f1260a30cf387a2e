"""The hooks SGLang applies: target-verify attention of the Triton backend through specdiag's kernel.

Registered on ``sglang.srt.layers.attention.triton_backend.TritonAttnBackend.forward_extend``
(AROUND): a call the kernel can serve (translate.decide) stores the draft block's KV exactly as
SGLang does and runs specdiag's split-KV kernel on SGLang's ragged layout (which one: below); every
other call goes to SGLang's own method unchanged. Each distinct decision is logged once per process
("which path runs and why").

Both verify shapes SGLang 0.5.17 sends are served: a tree (NGRAM, EAGLE: the custom mask SGLang passes) and a
linear block with no mask (DFLASH: causal inside the block; the plugin writes that causal block into SGLang's mask
layout once per forward, causal.py, and the log line says "causal draft block ... as DFLASH's").

Off unless asked: SGLang 0.5.17 loads every installed plugin when ``SGLANG_PLUGINS`` is unset, so the plugin acts
only when ``SGLANG_PLUGINS`` names ``specdiag_splitkv`` or ``SPECDIAG_SGLANG_VERIFY`` is set; otherwise
``register()`` registers nothing and logs once that it is installed and off. The mode comes from
``SPECDIAG_SGLANG_VERIFY`` (``splitkv`` when only ``SGLANG_PLUGINS`` names the plugin):
- ``splitkv``: the hook above.
- ``upstream``: no hook on forward_extend; SGLang's own split-KV verify (verify_splitkv.py, gated to
  gfx95 and topk 1 upstream) is switched on for every Triton backend, to compare with the plugin's
  kernel and SGLang's default. It computes a causal draft block: exact for chain drafts only.
- ``off``: nothing is registered; SGLang runs unchanged.

``SPECDIAG_SGLANG_NGRAM_TAIL`` (``1`` by default, ``0`` to leave it out; modes splitkv and upstream):
NGRAM's draft preparation reads only the prompt's tail instead of copying the whole prompt into a
Python list twice per verify step (ngram_tail.py). The same token lists, so the same drafts; the
hooks check on first use that SGLang's methods are the 0.5.17 code they copy, else SGLang's run.

Which kernel serves: the one specdiag's entry point names for the device and the cache's dtype
(specdiag.kernels.verify ``choose``; the call through its ``verify``), with ``SPECDIAG_SGLANG_GLUON`` (``1`` by
default): on sm_90, at every row count (heads x draft tokens; ``GLUON_MIN_ROWS``), the warp-specialized Gluon kernel
(specdiag.kernels.gluon.ragged, reading the draft rows from the cache at ``out_cache_loc``), faster than the Triton
ragged kernel from 8 rows up on the H200; up to 16 rows in its rows-as-N form (gluon.swap's partitions). Where it
cannot run (another GPU, a logit cap, a non-contiguous q) or failed once, the Triton ragged kernel through its
configuration ladder. ``0``: the Triton kernel only.

On an fp8 e4m3 cache (``--kv-cache-dtype fp8_e4m3``) on sm_90: the fp8 pick's kernel (gluon.ragged
``ragged_split_kv_gluon_fp8``: the cache converted exactly to fp16 tile by tile, the layer's k_scale applied, 1.0
without one; above 32 rows in row tiles of whole draft tokens). There is no Triton fp8 path: where the fp8 kernel
cannot run (another GPU, a logit cap, ``SPECDIAG_SGLANG_GLUON=0``, k_scale != v_scale) SGLang's own kernel serves the
call, with the reason logged once and counted, before anything is stored.

Prefill (``SPECDIAG_SGLANG_PREFILL``, ``off`` by default, ``mha``; modes splitkv and upstream): a pure Triton server's
long prompt chunks run the MHA form on specdiag's ragged flash-attention kernel instead of the absorbed form
(prefill.py). The log says once, per model runner, which verify and prefill paths run (backends.py).

KV slots (``SPECDIAG_SGLANG_KV_ALLOC``, ``sglang`` by default, ``contiguous``; any mode, and on its own): with
``contiguous`` the target's page_size-1 KV slots come from specdiag's contiguous allocator (contiguous.py).

KV layout (``SPECDIAG_SGLANG_LAYOUT=1``, any mode, ``off`` included, and on its own: it then activates only the layout
recorder): each target-verify forward's runs of consecutive KV slots, recorded without a host sync
(layout.py); in the stats file under ``layout``.

Counts (``STATS``): calls served and fallen back per reason, in this process. Under CUDA graphs
only captures and eager calls pass through Python, so these count calls of the hook, not replays.
With ``SPECDIAG_SGLANG_STATS=DIR`` each process writes ``DIR/stats-<pid>.json`` (at most once a
second while counts change). ``SPECDIAG_SGLANG_CHECK=1`` (eager servers only, e.g. decode CUDA graphs
off) runs SGLang's own kernel and the plugin's on every served call and records their relative error; on an fp8 cache
also each one's error against the fp32 reference of what the fp8 kernel computes (translate.fp8_reference), since
SGLang's own kernel casts q and P to fp8 and so is not the reference there.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

import torch

from specdiag_sglang_plugin import prefill
from specdiag_sglang_plugin.backends import INIT_BACKENDS, after_init_backends
from specdiag_sglang_plugin.logs import first_time, log_once, logger  # noqa: F401  (log_once: the plugin's one log)

MODE_ENV = "SPECDIAG_SGLANG_VERIFY"
PLUGINS_ENV = "SGLANG_PLUGINS"  # SGLang's allow-list of plugins (comma-separated entry point names)
ENTRY_POINT = "specdiag_splitkv"  # this plugin's name in the sglang.srt.plugins group (pyproject.toml)
STATS_ENV = "SPECDIAG_SGLANG_STATS"
CHECK_ENV = "SPECDIAG_SGLANG_CHECK"
NGRAM_TAIL_ENV = "SPECDIAG_SGLANG_NGRAM_TAIL"
GLUON_ENV = "SPECDIAG_SGLANG_GLUON"
MODES = ("splitkv", "upstream", "off")
#: the Gluon kernel serves from this many packed rows (heads x draft tokens) on sm_90: every row count (measured on
#: the H200 at 0.83-0.90 of the Triton ragged kernel's time at 8-16 rows, 0.69-0.72 at 24-32)
GLUON_MIN_ROWS = 1
FORWARD_EXTEND = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.forward_extend"
BACKEND_INIT = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.__init__"

STATS: dict = {"mode": None, "prefill": "off", "served": 0, "served_in_capture": 0, "served_gluon": 0, "served_causal": 0,
               "fallback": Counter(),
               "upstream_served": 0, "upstream_declined": 0, "ngram_tail": Counter()}
_last_write = [0.0]
_LADDER: list = []  # the ConfigLadder of this process, made on first use (specdiag.kernels.plan)
_GLUON: dict = {}  # shape key -> None (the Gluon kernel serves it) or why not (cannot run, or failed once)
_CAUSAL: list = []  # this process's causal.CausalMask, made on the first verify call without a custom mask


class Unservable(Exception):
    """A call decide() passes that no kernel of the plugin can run here (an fp8 cache where the fp8 kernel cannot
    run): raised before anything is stored, so SGLang's own path serves it; the message is the reason counted."""


def _on_config_choice(key, cfg, shared_bytes, failed) -> None:
    """Logged once per shape: the configuration the ladder settled on, and the rungs that did not fit."""
    entry = {"key": [str(k) for k in key], "config": cfg.as_dict(), "shared_bytes_estimate": shared_bytes,
             "out_of_resources": [{"config": c.as_dict(), "error": e} for c, e in failed]}
    STATS.setdefault("configs", []).append(entry)
    log_once("config:" + repr(key), "split-KV config for %s: block_m %d block_n %d warps %d stages %d "
             "(estimated shared memory %d B; %d larger rung(s) ran out of resources)", key, cfg.block_m,
             cfg.block_n, cfg.num_warps, cfg.num_stages, shared_bytes, len(failed))


def config_ladder(device):
    """This process's ConfigLadder, sized to ``device``'s shared memory on first use."""
    if not _LADDER:
        from specdiag.kernels.plan import ConfigLadder  # noqa: PLC0415
        from specdiag.kernels.triton.ragged import shared_limit  # noqa: PLC0415
        _LADDER.append(ConfigLadder(shared_limit=shared_limit(device), on_choice=_on_config_choice))
    return _LADDER[0]


def mode_from_env(environ=os.environ) -> str:
    mode = environ.get(MODE_ENV, "splitkv").strip().lower() or "splitkv"
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={mode!r}: choose one of {', '.join(MODES)}")
    return mode


def activation_from_env(environ=os.environ) -> tuple[bool, str]:
    """Whether the plugin acts, and why: only when ``SGLANG_PLUGINS`` names it or ``SPECDIAG_SGLANG_VERIFY`` is set.

    SGLang 0.5.17 loads every installed plugin when ``SGLANG_PLUGINS`` is unset (sglang/srt/plugins/__init__.py), so
    being loaded is no request to act: a server started without either variable must run SGLang unchanged.
    """
    mode = environ.get(MODE_ENV, "").strip()
    if mode:
        return True, f"{MODE_ENV}={mode}"
    named = {name.strip() for name in environ.get(PLUGINS_ENV, "").split(",") if name.strip()}
    if ENTRY_POINT in named:
        return True, f"{PLUGINS_ENV} names {ENTRY_POINT}"
    why = f"{PLUGINS_ENV} is unset" if not named else f"{PLUGINS_ENV}={environ.get(PLUGINS_ENV)} does not name it"
    return False, f"{why} and {MODE_ENV} is unset"


def stats_snapshot() -> dict:
    from specdiag_sglang_plugin import layout  # noqa: PLC0415

    return {"pid": os.getpid(), "mode": STATS["mode"], "served": STATS["served"],
            "served_in_capture": STATS["served_in_capture"], "served_gluon": STATS["served_gluon"],
            "served_causal": STATS["served_causal"],
            "gluon": {repr(k): (why or "serves") for k, why in _GLUON.items()}, "fallback": dict(STATS["fallback"]),
            "upstream_served": STATS["upstream_served"], "upstream_declined": STATS["upstream_declined"],
            "ngram_tail": dict(STATS["ngram_tail"]), "prefill_mode": STATS["prefill"],
            "prefill": {"served": dict(prefill.STATS["served"]), "declined": dict(prefill.STATS["declined"]),
                        "check": prefill.STATS["check"], "probe": dict(prefill.STATS["probe"])},
            "check": STATS.get("check", []), "configs": STATS.get("configs", []),
            "layout": layout.snapshot() if layout.RECORDS or layout.COUNTS else None}


def _maybe_write_stats(force: bool = False) -> None:
    folder = os.environ.get(STATS_ENV)
    if not folder:
        return
    now = time.monotonic()
    if not force and now - _last_write[0] < 1.0:
        return
    _last_write[0] = now
    path = Path(folder) / f"stats-{os.getpid()}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{threading.get_ident()}.tmp")  # the layout thread writes too
        tmp.write_text(json.dumps(stats_snapshot()))
        tmp.replace(path)
    except OSError as exc:
        log_once("stats-write", "cannot write stats to %s: %s", path, exc)


def _facts(backend, q, k, v, layer, forward_batch, sinks, score_mod):
    from specdiag_sglang_plugin.translate import CallFacts  # noqa: PLC0415

    verify = bool(forward_batch.forward_mode.is_target_verify())
    if not verify:  # cheap exit for prefill/decode: the rest is not needed
        return CallFacts(False, 0, False, 0, 0, False, False, False, False, False, False, 1, False, True, False,
                         q.dtype, q.dtype, False, q.is_cuda)
    from specdiag_sglang_plugin.translate import max_draft_tokens  # noqa: PLC0415

    pool = backend.token_to_kv_pool
    meta = backend.forward_metadata
    rows = int(layer.tp_q_head_num) * max_draft_tokens(getattr(meta, "max_extend_len", None), q.shape[0],
                                                        int(meta.qo_indptr.shape[0]) - 1)
    k_scale, v_scale = getattr(layer, "k_scale_float", None), getattr(layer, "v_scale_float", None)
    k_buf = pool.get_key_buffer(layer.layer_id)
    v_buf = pool.get_value_buffer(layer.layer_id)
    swa = getattr(layer, "sliding_window_size", None)
    attn_type = getattr(layer, "attn_type", None)
    causal = not getattr(layer, "is_cross_attention", False) and getattr(attn_type, "name", "DECODER") in (
        "DECODER",)
    return CallFacts(
        forward_mode_verify=True,
        page_size=int(getattr(backend, "page_size", 1) or 1),
        use_mla=bool(getattr(backend, "use_mla", False)),
        qk_head_dim=int(layer.qk_head_dim),
        v_head_dim=int(layer.v_head_dim),
        has_kv_tensors=k is not None and v is not None,
        kv_scaled=getattr(layer, "k_scale", None) is not None or getattr(layer, "v_scale", None) is not None,
        sliding_window=swa is not None and swa > -1,
        sinks=sinks is not None,
        score_mod=score_mod is not None,
        xai_temperature=(getattr(layer, "xai_temperature_len", -1) or -1) > 0,
        dcp_size=int(getattr(backend, "dcp_size", 1) or 1),
        deterministic=bool(getattr(backend, "enable_deterministic", False)),
        causal=causal,
        has_custom_mask=not causal_call(backend, forward_batch),
        has_mask_indptr=getattr(backend.forward_metadata, "mask_indptr", None) is not None,
        q_dtype=q.dtype,
        kv_dtype=k_buf.dtype,
        value_is_latent_view=(v_buf.data_ptr() == k_buf.data_ptr() and v_buf.stride() == k_buf.stride()
                              and v_buf.shape[-1] == 512),
        is_cuda=q.is_cuda and torch.version.hip is None,
        rows=rows,
        kv_scales_equal=(getattr(layer, "k_scale", None) is None) or (k_scale is not None and k_scale == v_scale),
    )


def kv_scale_of(layer) -> float:
    """The fp8 cache's dequantization scale: the layer's k_scale (a Python float SGLang keeps beside the
    parameter), 1.0 when it has none (SGLang then stores ``k.to(fp8)`` and its kernel multiplies by 1.0)."""
    return 1.0 if getattr(layer, "k_scale", None) is None else float(layer.k_scale_float)


def _store_draft_kv(backend, layer, forward_batch, k, v) -> None:
    """The draft block's KV into the pool as SGLang's forward_extend stores it (no DCP: decide() keeps it SGLang's):
    plainly without a k_scale; with one (an fp8 latent cache: decide() serves no other), ``k / k_scale``."""
    from sglang.srt.layers.attention import triton_backend as tb  # noqa: PLC0415

    meta = backend.forward_metadata
    loc_info = tb.KVWriteLoc(forward_batch.out_cache_loc, meta.swa_out_cache_loc,
                             full_loc=meta.out_cache_loc_full_physical)
    if getattr(layer, "k_scale", None) is None:
        backend._set_kv_buffer(forward_batch, layer, loc_info, k, v)
    else:
        backend.token_to_kv_pool.set_kv_buffer(layer, loc_info, k.clone().div_(layer.k_scale), v)


#: spec_info classes whose verify block is a linear chain: causal inside the block whatever mask buffer comes with it
LINEAR_VERIFY_INPUTS = ("DFlashVerifyInput",)


def linear_block(forward_batch) -> bool:
    """Whether the call verifies a linear draft block (DFLASH's), to be served as the causal block.

    SGLang 0.5.17 captures DFLASH's verify with a custom mask when the attention backend object is not one it lists as
    expressing the block causally (``dflash_utils.resolve_dflash_verify_mask_policy``): a ``HybridAttnBackend`` (the
    recommended ``--attention-backend flashinfer --decode-attention-backend triton`` server) is not listed, though its
    verify goes to the Triton backend. The graph then reads the Triton backend's verify-mask buffer, which nothing
    writes for DFLASH (its verify input carries no mask): zeros, every draft entry masked. DFLASH's block is causal by
    definition, so the plugin serves it as the causal block, as on a pure Triton server."""
    return type(getattr(forward_batch, "spec_info", None)).__name__ in LINEAR_VERIFY_INPUTS


def causal_call(backend, forward_batch) -> bool:
    """The call is served as the causal draft block: no custom mask, or a linear block (:func:`linear_block`)."""
    return backend.forward_metadata.custom_mask is None or linear_block(forward_batch)


def verify_mask(backend, layer, forward_batch, max_draft: int) -> torch.Tensor:
    """The call's tree mask: SGLang's custom mask, or for a linear verify block (DFLASH's, with or without a mask
    buffer: :func:`linear_block`) the causal block in the same layout (causal.CausalMask, written once per forward,
    CUDA-graph safe)."""
    meta = backend.forward_metadata
    if not causal_call(backend, forward_batch):
        return meta.custom_mask
    from specdiag_sglang_plugin.causal import CausalMask  # noqa: PLC0415

    if not _CAUSAL:
        _CAUSAL.append(CausalMask())
    slots = int(backend.token_to_kv_pool.get_key_buffer(layer.layer_id).shape[0])
    req_pool = getattr(backend, "req_to_token_pool", None)
    max_requests = max(int(getattr(req_pool, "size", 0) or 0), int(meta.qo_indptr.shape[0]) - 1)
    return _CAUSAL[0].for_call(forward_batch, meta, max_draft, slots, max_requests)


def _serve(backend, q, k, v, layer, forward_batch, save_kv_cache):
    """The kernel for this call chosen (an fp8 cache: the fp8 kernel or ``Unservable``, before anything is stored),
    the draft KV stored as SGLang stores it, then the kernel: on sm_90 the Gluon kernel, else the ragged Triton one."""
    from sglang.srt.layers.attention import triton_backend as tb  # noqa: PLC0415
    from specdiag.kernels.verify import GLUON, GLUON_FP8, TRITON, verify  # noqa: PLC0415
    from specdiag_sglang_plugin.translate import max_draft_tokens  # noqa: PLC0415

    attn_out = getattr(forward_batch, "_attn_output", None)
    o = attn_out if attn_out is not None else q.new_empty((q.shape[0], layer.tp_q_head_num * layer.v_head_dim))
    meta = backend.forward_metadata
    logit_cap = tb.logit_capping_mod(layer.logit_capping_method, layer.logit_cap)
    heads = layer.tp_q_head_num
    batch = meta.qo_indptr.shape[0] - 1
    max_draft = max_draft_tokens(meta.max_extend_len, q.shape[0], batch)
    kv_buf = backend.token_to_kv_pool.get_key_buffer(layer.layer_id)
    key = (heads * max_draft, q.dtype, kv_buf.dtype, bool(logit_cap and logit_cap > 0), q.device.index)
    causal = causal_call(backend, forward_batch)

    if kv_buf.dtype == torch.float8_e4m3fn:
        scale = kv_scale_of(layer)
        if not _gluon_fp8_serves(key, q, kv_buf, scale, forward_batch, logit_cap):
            raise Unservable(f"fp8 KV cache: {_GLUON[key]}")
        mask = verify_mask(backend, layer, forward_batch, max_draft)
        if save_kv_cache:
            _store_draft_kv(backend, layer, forward_batch, k, v)
        try:
            verify(q.view(-1, heads, layer.qk_head_dim), kv_buf, o.view(-1, heads, layer.v_head_dim), meta.qo_indptr,
                   meta.kv_indptr, meta.kv_indices, mask, meta.mask_indptr, max_draft=max_draft,
                   sm_scale=layer.scaling, draft_loc=forward_batch.out_cache_loc, kv_scale=scale, kernel=GLUON_FP8)
        except Exception as exc:  # noqa: BLE001  compile or launch: SGLang's kernel serves this shape from now on
            _GLUON[key] = f"failed: {type(exc).__name__}: {' '.join(str(exc).split())[-300:]}"
            log_once("gluon-failed:" + repr(key), "fp8 Gluon kernel failed for %s, SGLang's kernel serves it: %s",
                     key, _GLUON[key])
            raise
        _count_served(gluon=True, causal=causal)
        return o

    mask = verify_mask(backend, layer, forward_batch, max_draft)
    if save_kv_cache:
        _store_draft_kv(backend, layer, forward_batch, k, v)
    ladder = config_ladder(q.device)
    ladder.elem_bytes = q.element_size()

    if _gluon_serves(key, q, backend, layer, forward_batch, logit_cap):
        try:
            verify(q.view(-1, heads, layer.qk_head_dim), kv_buf, o.view(-1, heads, layer.v_head_dim), meta.qo_indptr,
                   meta.kv_indptr, meta.kv_indices, mask, meta.mask_indptr, max_draft=max_draft,
                   sm_scale=layer.scaling, draft_loc=forward_batch.out_cache_loc, kernel=GLUON)
            _count_served(gluon=True, causal=causal)
            return o
        except Exception as exc:  # noqa: BLE001  compile or launch: the Triton kernel serves this shape from now on
            cause = f" (cause: {type(exc.__cause__).__name__}: {str(exc.__cause__)[:300]})" if exc.__cause__ else ""
            _GLUON[key] = f"failed: {type(exc).__name__}: {' '.join(str(exc).split())[-300:]}{cause}"
            log_once("gluon-failed:" + repr(key), "Gluon kernel failed for %s, the Triton kernel serves it: %s", key,
                     _GLUON[key])

    def launch(cfg):
        return verify(
            q.view(-1, heads, layer.qk_head_dim), backend.token_to_kv_pool.get_key_buffer(layer.layer_id),
            o.view(-1, heads, layer.v_head_dim), meta.qo_indptr, meta.kv_indptr, meta.kv_indices, mask,
            meta.mask_indptr, max_draft=max_draft, sm_scale=layer.scaling,
            # the draft values are k's first 512 dims: what the MLA pool stores of them (set_kv_buffer keeps k)
            k_ext=k.reshape(k.shape[0], -1), logit_cap=logit_cap, cfg=cfg, kernel=TRITON,
        )

    ladder.run(key, heads * max_draft, launch)
    _count_served(gluon=False, causal=causal)
    return o


def _count_served(gluon: bool, causal: bool = False) -> None:
    STATS["served"] += 1
    STATS["served_gluon"] += int(gluon)
    STATS["served_causal"] += int(causal)
    if torch.cuda.is_current_stream_capturing():
        STATS["served_in_capture"] += 1


def gluon_from_env(environ=os.environ) -> bool:
    value = environ.get(GLUON_ENV, "1").strip() or "1"
    if value not in ("0", "1"):
        raise ValueError(f"{GLUON_ENV}={value!r}: 1 (the Gluon kernel on sm_90) or 0 (Triton only)")
    return value == "1"


def _gluon_serves(key, q, backend, layer, forward_batch, logit_cap) -> bool:
    """Whether the Gluon kernel serves this call (module doc); each reason it does not is logged once per shape."""
    from specdiag.kernels.gluon.swap import SWAP_MAX_ROWS  # noqa: PLC0415
    from specdiag.kernels.verify import GLUON, choose  # noqa: PLC0415

    if key[0] < GLUON_MIN_ROWS or not gluon_from_env():
        return False
    if key not in _GLUON:
        loc = getattr(forward_batch, "out_cache_loc", None)
        kernel, why = choose(q, backend.token_to_kv_pool.get_key_buffer(layer.layer_id), logit_cap=logit_cap)
        ok = kernel == GLUON
        if ok and (loc is None or loc.shape[0] < q.shape[0]):
            ok, why = False, "no out_cache_loc slot per draft token"
        _GLUON[key] = None if ok else why
        log_once("gluon:" + repr(key), "verify kernel for %s: %s", key,
                 ("warp-specialized Gluon (sm_90)" + (", the rows as the wgmma's N" if key[0] <= SWAP_MAX_ROWS else ""))
                 if ok else f"Triton ragged ({why})")
    return _GLUON[key] is None


def _gluon_fp8_serves(key, q, kv_buf, kv_scale, forward_batch, logit_cap) -> bool:
    """Whether the fp8 kernel serves this call (an fp8 cache has no other kernel here: where it does not, SGLang's
    does); each reason it does not is kept per shape and logged once."""
    if key not in _GLUON:
        from specdiag.kernels.verify import GLUON_FP8, choose  # noqa: PLC0415

        if not gluon_from_env():
            ok, why = False, f"{GLUON_ENV}=0 (the fp8 kernel is the Gluon one)"
        else:
            kernel, why = choose(q, kv_buf, kv_scale, logit_cap)
            ok = kernel == GLUON_FP8
        loc = getattr(forward_batch, "out_cache_loc", None)
        if ok and (loc is None or loc.shape[0] < q.shape[0]):
            ok, why = False, "no out_cache_loc slot per draft token"
        _GLUON[key] = None if ok else why
        log_once("gluon:" + repr(key), "verify kernel for %s: %s", key,
                 f"warp-specialized Gluon on the fp8 cache (sm_90, the rows as the wgmma's N, scale {kv_scale})"
                 if ok else f"SGLang's own ({why})")
    return _GLUON[key] is None


def _check(original, backend, q, k, v, layer, forward_batch, save_kv_cache, kwargs):
    """Check mode (eager calls only): SGLang's own output, then the kernel's on the same inputs.

    Records the relative error ||ours - SGLang|| / ||SGLang|| per call in STATS["check"] and returns
    the kernel's output. Reads tensor values (a host sync): never used under CUDA-graph capture.
    """
    ref = original(backend, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, **kwargs)
    ref = ref.clone()
    ours = _serve(backend, q, k, v, layer, forward_batch, save_kv_cache=False)
    meta = backend.forward_metadata
    prefix = (meta.kv_indptr[1:] - meta.kv_indptr[:-1]).tolist()
    checks = STATS.setdefault("check", [])
    if len(checks) < 2000:
        row = {"layer": int(layer.layer_id), "prefix_tokens": prefix, "draft_tokens": int(q.shape[0]),
               "causal_block": causal_call(backend, forward_batch),
               "heads": int(layer.tp_q_head_num), "rel_err": _rel_err(ours, ref),
               "finite": bool(torch.isfinite(ours).all())}
        kv_buf = backend.token_to_kv_pool.get_key_buffer(layer.layer_id)
        if kv_buf.dtype == torch.float8_e4m3fn:  # SGLang's kernel casts q and P to fp8: the fp32 reference too
            from specdiag_sglang_plugin.translate import VerifyBatch, fp8_reference  # noqa: PLC0415

            heads = layer.tp_q_head_num
            from specdiag_sglang_plugin.translate import max_draft_tokens  # noqa: PLC0415

            mask = verify_mask(backend, layer, forward_batch,
                               max_draft_tokens(meta.max_extend_len, q.shape[0], meta.qo_indptr.shape[0] - 1))
            batch = VerifyBatch(q=q.view(-1, heads, layer.qk_head_dim), k_ext=k, v_ext=v, kv_buffer=kv_buf,
                                qo_indptr=meta.qo_indptr, kv_indptr=meta.kv_indptr, kv_indices=meta.kv_indices,
                                custom_mask=mask, mask_indptr=meta.mask_indptr, sm_scale=layer.scaling)
            exact = fp8_reference(batch, forward_batch.out_cache_loc, kv_scale_of(layer)).reshape(ours.shape)
            row.update(kv_dtype="float8_e4m3fn", rel_err_ref=_rel_err(ours, exact),
                       sglang_rel_err_ref=_rel_err(ref, exact))
        checks.append(row)
    return ours


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||, in fp32."""
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def forward_extend_hook(original, backend, q, k, v, layer, forward_batch, save_kv_cache=True,
                        sinks=None, score_mod=None, aux_tensors=None, **kwargs):
    """AROUND hook of TritonAttnBackend.forward_extend: an MHA-form prefill call on specdiag's prefill kernel where
    ``SPECDIAG_SGLANG_PREFILL=mha`` (prefill.py), a target-verify call on the split-KV kernel where it can serve (mode
    splitkv), SGLang elsewhere."""
    from specdiag_sglang_plugin.translate import decide  # noqa: PLC0415

    if STATS["prefill"] == "mha" and prefill.is_mha_call(backend, k, layer, forward_batch, save_kv_cache):
        if forward_batch.attn_attend_prefix_cache is not None:  # the chunked-prefix path: SGLang's Triton has none
            try:  # the dispatch hook chose it after the kernel's probe passed here
                return prefill.mha_call(backend, q, k, v, layer, forward_batch)
            except Exception as exc:
                prefill.mark_failed(q.device, q.dtype, exc)  # later chunks stay in SGLang's absorbed form
                raise
        ready, why = prefill.kernel_ready(q.device, q.dtype)
        if not ready:  # a first chunk: SGLang's own kernel serves it
            prefill.STATS["declined"][why] += 1
            return original(backend, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, sinks=sinks,
                            score_mod=score_mod, aux_tensors=aux_tensors, **kwargs)
        try:
            return prefill.mha_call(backend, q, k, v, layer, forward_batch)
        except Exception as exc:  # noqa: BLE001  a first chunk: SGLang's own kernel serves it
            if first_time(f"prefill-error:{type(exc).__name__}"):
                logger.exception("[specdiag plugin] prefill kernel failed on a first chunk; SGLang's serves it and "
                                 "every later chunk")
            prefill.mark_failed(q.device, q.dtype, exc)
            prefill.STATS["declined"][f"kernel error: {type(exc).__name__}"] += 1
            return original(backend, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, sinks=sinks,
                            score_mod=score_mod, aux_tensors=aux_tensors, **kwargs)
    if STATS["mode"] != "splitkv":
        return original(backend, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, sinks=sinks,
                        score_mod=score_mod, aux_tensors=aux_tensors, **kwargs)
    serve, reason = decide(_facts(backend, q, k, v, layer, forward_batch, sinks, score_mod))
    if serve:
        log_once("serve:" + reason, "verify attention runs on specdiag's split-KV kernel: %s", reason)
        try:
            if os.environ.get(CHECK_ENV) == "1" and not torch.cuda.is_current_stream_capturing():
                out = _check(original, backend, q, k, v, layer, forward_batch, save_kv_cache,
                             dict(sinks=sinks, score_mod=score_mod, aux_tensors=aux_tensors, **kwargs))
                _maybe_write_stats()
                return out
            out = _serve(backend, q, k, v, layer, forward_batch, save_kv_cache)
            _maybe_write_stats()
            return out
        except Unservable as exc:  # nothing stored: SGLang's path, counted under the reason
            reason = str(exc)
        except Exception as exc:  # noqa: BLE001  SGLang's path instead (it stores the same KV again)
            reason = f"kernel error: {type(exc).__name__}: {exc}"
            if first_time(reason):  # the traceback once per distinct error, not once per layer and step
                logger.exception("[specdiag plugin] split-KV kernel failed; falling back to SGLang's verify")
    STATS["fallback"][reason] += 1
    if reason != "not a target-verify step":
        log_once("fallback:" + reason, "verify attention falls back to SGLang's own kernel: %s", reason)
    _maybe_write_stats()
    return original(backend, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache, sinks=sinks,
                    score_mod=score_mod, aux_tensors=aux_tensors, **kwargs)


def ngram_tail_from_env(environ=os.environ) -> bool:
    value = environ.get(NGRAM_TAIL_ENV, "1").strip().lower() or "1"
    if value not in ("0", "1", "off", "on", "false", "true"):
        raise ValueError(f"{NGRAM_TAIL_ENV}={value!r}: use 1 (on, the default) or 0 (off)")
    return value in ("1", "on", "true")


_NGRAM_OK: dict = {}  # per method: (ok, why), the source check of SGLang's method, made on its first call


def _ngram_around(replacement, name):
    """AROUND hook: the tail-reading replacement when SGLang's method is the 0.5.17 code, else SGLang's."""
    from specdiag_sglang_plugin import ngram_tail  # noqa: PLC0415

    def hook(original, worker, batch, *args, **kwargs):
        if name not in _NGRAM_OK:
            _NGRAM_OK[name] = ngram_tail.source_matches(original)
            ok, why = _NGRAM_OK[name]
            log_once("ngram:" + name, "NGRAM prompt-tail %s %s: %s", name, "on" if ok else "NOT applied", why)
        if _NGRAM_OK[name][0] and not args and not kwargs:
            try:
                out = replacement(worker, batch)
            except Exception as exc:  # noqa: BLE001  SGLang's method from now on, and this call too
                _NGRAM_OK[name] = (False, f"replacement raised {type(exc).__name__}: {exc}")
                logger.exception("[specdiag plugin] NGRAM prompt-tail %s failed; SGLang's method from now on", name)
            else:
                STATS["ngram_tail"][name] += 1
                _maybe_write_stats()
                return out
        STATS["ngram_tail"]["sglang_" + name] += 1
        _maybe_write_stats()
        return original(worker, batch, *args, **kwargs)

    return hook


def register_ngram_tail(registry, hook_type) -> None:
    """Register the two NGRAM AROUND hooks (no sglang import here: the check runs on first call)."""
    from specdiag_sglang_plugin import ngram_tail  # noqa: PLC0415

    registry.register(ngram_tail.PREPARE, _ngram_around(ngram_tail.prepare_draft_tokens, "prepare"),
                      hook_type.AROUND)
    registry.register(ngram_tail.UPDATE, _ngram_around(ngram_tail.update_ngram_corpus, "update"), hook_type.AROUND)
    log_once("ngram-registered", "%s=1: NGRAM drafting reads only the prompt's tail (hooks registered)",
             NGRAM_TAIL_ENV)


def backend_init_upstream_hook(result, backend, *args, **kwargs):
    """AFTER hook of TritonAttnBackend.__init__: force SGLang's upstream split-KV verify on, and count it."""
    original = backend.verify_splitkv_fwd

    def counted(*a, **kw):
        ran = original(*a, **kw)
        STATS["upstream_served" if ran else "upstream_declined"] += 1
        _maybe_write_stats()
        return ran

    backend.verify_splitkv_fwd = counted
    backend.use_verify_splitkv = True
    log_once("upstream", "SGLang's upstream split-KV verify forced on (topk %s; causal draft block)",
             getattr(backend, "topk", "?"))
    return None


def register_layout(registry, hook_type) -> None:
    """The KV-layout recorder's BEFORE hook on ModelRunner.forward; its records reach the stats file."""
    from specdiag_sglang_plugin import layout  # noqa: PLC0415

    layout._STATE["on_new"] = lambda: _maybe_write_stats(force=True)
    registry.register(layout.MODEL_RUNNER_FORWARD, layout.before_forward_hook, hook_type.BEFORE)
    log_once("layout", "%s=1: the KV layout of every target-verify forward is recorded (runs of consecutive slots)%s",
             layout.LAYOUT_ENV, "" if os.environ.get(STATS_ENV) else f"; set {STATS_ENV}=DIR to write it to files")


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: register the hooks of the chosen mode, or nothing unless asked
    (:func:`activation_from_env`); the KV-layout recorder whenever ``SPECDIAG_SGLANG_LAYOUT=1``."""
    from specdiag_sglang_plugin.contiguous import register_kv_alloc  # noqa: PLC0415
    from specdiag_sglang_plugin.layout import layout_from_env  # noqa: PLC0415

    register_kv_alloc()  # SPECDIAG_SGLANG_KV_ALLOC, on its own like the layout recorder (contiguous.py)
    if layout_from_env():
        try:
            from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # noqa: PLC0415
        except ImportError as exc:
            log_once("import-layout", "SGLang's hook registry is not importable (%s): no layout recorder", exc)
        else:
            register_layout(HookRegistry, HookType)
    active, why = activation_from_env()
    if not active:
        STATS["mode"] = "off"
        log_once("inactive", "installed and off (%s): nothing registered, SGLang runs unchanged; to turn it on set "
                 "%s=splitkv (or %s=%s)", why, MODE_ENV, PLUGINS_ENV, ENTRY_POINT)
        return
    mode = mode_from_env()
    STATS["mode"] = mode
    if mode == "off":
        log_once("mode", "%s=off: nothing registered, SGLang's verify attention runs unchanged", MODE_ENV)
        return
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # noqa: PLC0415
    except ImportError as exc:
        log_once("import", "SGLang's hook registry is not importable (%s): nothing registered", exc)
        return
    if ngram_tail_from_env():
        register_ngram_tail(HookRegistry, HookType)
    wants_prefill = prefill.prefill_from_env() == "mha"
    if mode == "upstream":
        HookRegistry.register(BACKEND_INIT, backend_init_upstream_hook, HookType.AFTER)
        log_once("mode", "mode upstream (%s): SGLang's own split-KV verify is forced on in the Triton backend", why)
    try:
        import specdiag.kernels.triton.ragged  # noqa: F401, PLC0415
    except Exception as exc:  # noqa: BLE001  (no triton, no specdiag: SGLang's own path)
        log_once("import", "specdiag's kernels do not import (%s: %s): SGLang's attention runs unchanged",
                 type(exc).__name__, exc)
        if mode == "splitkv":
            STATS["mode"] = "off"
        wants_prefill = False
    if wants_prefill and prefill.register_prefill(HookRegistry, HookType):
        STATS["prefill"] = "mha"
    HookRegistry.register(INIT_BACKENDS, after_init_backends(STATS["mode"] == "splitkv", STATS["prefill"] == "mha"),
                          HookType.AFTER)
    if STATS["mode"] != "splitkv" and STATS["prefill"] != "mha":
        return
    # like SGLang's own Triton launchers, kept out of torch.compile's tracing (a graph break, run eagerly)
    HookRegistry.register(FORWARD_EXTEND, torch.compiler.disable(forward_extend_hook), HookType.AROUND)
    if STATS["mode"] == "splitkv":
        log_once("mode", "mode splitkv (%s): MLA target-verify attention of the Triton backend goes through "
                 "specdiag's split-KV kernel where it can serve", why)
