"""09's prefill, chunk by chunk: each chunk's time (SGLang's stage latencies of the request) against the floor of the
attention form that ran it (pure).

**The form** (SGLang 0.5.17, ``models/deepseek_common/attention_backend_handler.py``): a chunk with no prefix (the
first) runs the MHA form. A chunk with a prefix runs the MHA form through SGLang's chunked-prefix path where the
server's ``--attention-backend`` is one whose kernels read that layout (``server_args.py``
``CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS``, :data:`CHUNKED_PREFIX_BACKENDS`; ``maybe_disable_chunked_prefix_cache``
reads ``--attention-backend`` only, so a Triton server with FlashInfer's prefill backend does not get it), or on a
Triton server where the specdiag plugin serves long prompts' chunks in the MHA form (``SPECDIAG_SGLANG_PREFILL=mha``);
otherwise the absorbed MLA form (2,176 FLOP per query-key pair and head against the MHA form's 640 at Kimi K2.6's
shape). Each chunk's floor: :func:`specdiag.prefill.chunk_floor` in that form.

**The times** (:mod:`specdiag.serving.stages`, a row's ``server_stages``: the difference of two /metrics scrapes
around the prefill request, server-reported): the last chunk's time is ``prefill_forward`` minus the other chunks'
``chunked_prefill`` seconds (exact); each other chunk lies in the histogram bucket it was counted in. A chunk attends
to a longer prefix than the one before it, so its time grows with its index: the buckets are given to the chunks in
ascending order (an assumption, said on the page). A server without ``--enable-metrics``, or a run whose rows predate
the capture, has no ``server_stages``: the page says so and shows the floors alone.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import pandas as pd

from specdiag import prefill

#: SGLang 0.5.17's CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS (server_args.py)
CHUNKED_PREFIX_BACKENDS = ("flashinfer", "fa3", "fa4", "flashmla", "cutedsl_mla", "cutlass_mla", "trtllm_mla",
                           "tokenspeed_mla")


def later_chunk_form(record: Mapping[str, Any]) -> tuple[str, str]:
    """The form of a chunk with a prefix on an arm's server (module doc), and why, from its record (server info and
    environment)."""
    srv = dict(record.get("server") or {})
    env = dict(record.get("env") or {})
    backend = str(srv.get("attention_backend") or "")
    if backend in CHUNKED_PREFIX_BACKENDS and not srv.get("disable_chunked_prefix_cache"):
        return "mha", f"SGLang's chunked-prefix MHA path (--attention-backend {backend})"
    if backend == "triton" and str(env.get("SPECDIAG_SGLANG_PREFILL") or "").lower() == "mha":
        return "mha", "the plugin's MHA prefill (SPECDIAG_SGLANG_PREFILL=mha)"
    return "absorbed", (f"the absorbed MLA form (--attention-backend {backend or 'not reported'}: no chunked-prefix "
                        "cache)")


def chunk_times(stages: Mapping[str, Any] | None, n_chunks: int) -> list[tuple[float, float]] | None:
    """(lo, hi) seconds of each chunk from a row's ``server_stages`` (module doc), the last exact (lo == hi); None
    where the stages do not hold this prefill (no ``prefill_forward`` of one request, or a ``chunked_prefill`` count
    other than ``n_chunks - 1``)."""
    stages = stages or {}
    pf, cp = stages.get("prefill_forward") or {}, stages.get("chunked_prefill") or {}
    if pf.get("count") != 1:
        return None
    others = int(cp.get("count") or 0)
    if others != n_chunks - 1:
        return None
    bounds: list[tuple[float, float]] = []
    for lower, upper, n in cp.get("buckets") or []:
        bounds += [(float(lower), math.inf if upper is None else float(upper))] * int(n)
    last = float(pf["sum_s"]) - float(cp.get("sum_s") or 0.0)
    return bounds + [(last, last)]


def chunk_table(pre_rows: Sequence[Mapping[str, Any]], arms_meta: Mapping[str, Any], geom: Any, peaks: Any,
                tp_size: int = 1) -> pd.DataFrame:
    """One row per chunk of every prefill row that carries ``server_stages``: arm, context, chunk, prefix (tokens),
    form and why, its floor in that form and in the other form (s, computed), its time (s, server-reported: exact for
    the last chunk, else its histogram bucket) and time over floor (x)."""
    out = []
    for r in pre_rows:
        if r.get("phase") != "prefill" or r.get("error") or not r.get("server_stages"):
            continue
        rec = dict(arms_meta.get(r.get("arm")) or {})
        ctx, chunk = int(r["context_tokens"]), prefill.chunk_tokens_of(rec.get("server"))
        n = math.ceil(ctx / chunk) if chunk else 1
        times = chunk_times(r["server_stages"], n)
        if times is None:
            continue
        later, why = later_chunk_form(rec)
        forms = ["mha"] + [later] * (n - 1)
        floors = prefill.chunk_floors(geom, ctx, chunk, peaks, forms, tp_size)
        others = prefill.chunk_floors(geom, ctx, chunk, peaks, ["mha"] + ["absorbed" if later == "mha" else "mha"]
                                      * (n - 1), tp_size)
        for f, o, (lo, hi) in zip(floors, others, times):
            out.append({"arm": r.get("arm"), "context_tokens": ctx, "repeat": r.get("repeat"), "chunk": f.index,
                        "prefix_tokens": f.prefix_tokens, "form": f.form,
                        "why": "no prefix: the MHA form" if f.index == 0 else why, "floor_s": f.floor_s,
                        "other_form_floor_s": o.floor_s, "time_lo_s": lo, "time_hi_s": hi,
                        "over_floor_lo_x": lo / f.floor_s if f.floor_s else None,
                        "over_floor_hi_x": hi / f.floor_s if f.floor_s and hi != math.inf else None})
    return pd.DataFrame(out)


def chunk_note(pre_rows: Sequence[Mapping[str, Any]]) -> str:
    """Which prefill rows hold their chunks' times, in words."""
    rows = [r for r in pre_rows if r.get("phase") == "prefill" and not r.get("error")]
    have = [r for r in rows if r.get("server_stages")]
    if not rows:
        return "no prefill rows"
    if not have:
        return ("no prefill row of this run holds SGLang's stage latencies (server_stages: its servers ran without "
                "--enable-metrics, or the run was recorded before 09 kept them), so each chunk's floor is shown "
                "without its time")
    return (f"{len(have)} of {len(rows)} prefill rows hold their chunks' times (SGLang's per-request stage latencies, "
            "server-reported); the chunks other than the last are placed by histogram bucket, in ascending order")


def form_floors(pre: pd.DataFrame, arms_meta: Mapping[str, Any], geom: Any, peaks: Any, tp_size: int = 1
                ) -> pd.DataFrame:
    """Per arm and context of :func:`.analysis.prefill_table`: the form its chunks with a prefix ran in and why, the
    prefill's floor in that form (its chunks' floors summed, s, computed) beside the MHA form's, and the TTFT over the
    floor of the form that ran (x): how far the prefill is from what its own kernels' FLOPs allow."""
    out = []
    for r in pre.itertuples() if not pre.empty else ():
        rec = dict(arms_meta.get(r.arm) or {})
        ctx, chunk = int(r.context_tokens), prefill.chunk_tokens_of(rec.get("server"))
        later, why = later_chunk_form(rec)
        ran = sum(f.floor_s for f in prefill.chunk_floors(geom, ctx, chunk, peaks, ["mha", later], tp_size))
        mha = sum(f.floor_s for f in prefill.chunk_floors(geom, ctx, chunk, peaks, ["mha"], tp_size))
        out.append({"arm": r.arm, "context_tokens": ctx, "form": later if (chunk and ctx > chunk) else "mha",
                    "why": why if (chunk and ctx > chunk) else "one chunk, no prefix: the MHA form",
                    "floor_form_s": ran, "floor_mha_s": mha, "ttft_s": r.ttft_s, "own": r.own,
                    "ttft_over_form_floor_x": r.ttft_s / ran if ran else None})
    return pd.DataFrame(out)
