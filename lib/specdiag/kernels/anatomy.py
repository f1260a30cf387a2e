"""Where a split-KV call's fixed cost goes: each part of the call timed alone, on the same inputs (issue 13, run 7).

Run 5's fits put split_p1 at 21-24 us of fixed cost per call (time = fixed + bytes / loop rate over 64k-256k),
against 3.9 us for a plain copy; at 128k the memory targets leave 4-5 us. The fit cannot say what the 21 us is.
This module times, per case, with the harness's method (:func:`specdiag.kernels.timing.time_calls`: CUDA events,
a sleep queued first, rotating input sets so the KV is cold), these parts of a split_p1 call:

- ``empty_1`` / ``empty_2``: one launch of an empty kernel with the partial kernel's grid, and that launch followed
  by an empty launch with the merge's grid: what launching alone costs in this timing.
- ``read_torch``: torch's fp32 sum of the case's KV rows in slot order (one tuned reduction over the same bytes, no
  gather): what a read-only stream of these bytes costs in this timing, beside the copy.
- ``read_gather``: a read-only kernel with the partial kernel's grid, split and KV tile: each program loads the
  rows of its split through the token table (the same gather, pipelined) and sums them. ``read_contig``: the same
  over rows in slot order. The floor of this grid's access pattern, without the attention math.
- ``partial``: the partial kernel alone (``split_kv_triton(partial_only=True)``); ``merge``: the merge kernel alone
  on partials already written; ``full``: both (split_p1); ``full_pdl``: both, the merge as a programmatic dependent
  launch (split_pdl_p1).
- ``timeline``: the partial kernel with each program writing %globaltimer at entry, at the end of its full-tile
  loop and when done, and its SM (:func:`timeline_stats`: launch ramp, per-program durations, the tail); CUDA only.
- The ``full`` row also carries the GPU's own durations of its two kernels and the gap between them, from the
  torch profiler (CUPTI): ``prof_partial_us``, ``prof_merge_us``, ``prof_gap_us`` (medians over the profiled calls).
- With ``--ws`` (session 10, :func:`measure_ws`): ``pick_ws``, the pick (``split_gwsw8_p1`` since run 41; session
  11's calls 1, 2 and 7 timed run 37's ``split_gwrp_p1``: each row names its kernel), and ``read_ws``, the read-only kernel of its launch shape (gluon_ws_read): what the
  pick's one program per SM, copy warpgroup and 64-token ring cost before any math; ``timeline_ws``, the same
  read-only kernel with each program writing %globaltimer at its start, when its first tile lands, after its last
  and when done, and its SM (:func:`ws_timeline_stats`: the stream's start latency, the stream, the tail);
  ``--ws-read-shapes`` adds the read-only kernel with other rings (``read_ws_<block_n>x<stages>``, session 11).

:func:`anatomy_fits` fits each part over the contexts of a shape (least squares of time on KV bytes), so each
part's fixed cost and rate sit side by side. Rows go to the run folder's ``kernel_anatomy`` table; a part that
fails is a row with its error, and the rows already measured stay.

    python -m specdiag.kernels.anatomy --out RUN --cases 16384:8:1,65536:8:1,131072:8:1,262144:8:1
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import os
import statistics
import sys
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import pandas as pd
import torch

from specdiag.kernels.mla import BLOCK_TOKENS, D_NOPE, D_PE, VerifyShape, kv_bytes, make_inputs
from specdiag.stats import fit_line, quantile

TABLE = "kernel_anatomy"
#: the parts of a call, in the order measured (module doc)
PARTS: tuple[str, ...] = ("empty_1", "empty_2", "read_torch", "read_gather", "read_contig", "partial", "merge", "full", "full_pdl",
                          "timeline")


#: the parts ``--ws`` adds (session 10): the read floor of the pick's launch shape, and the pick since run 37
WS_PARTS: tuple[str, ...] = ("read_ws", "pick_ws")
WS_PICK_RING: tuple[int, int] = (64, 2)  #: the pick's ring (gluon_tile of split_gwrp_p1): 64-token tiles, two of them


def timeline_stats(start_ns: Sequence[int], loop_end_ns: Sequence[int], done_ns: Sequence[int],
                   sm: Sequence[int]) -> dict[str, Any]:
    """One partial launch's per-program timeline (globaltimer ns) summed up, in us from the first program's entry.

    ``tl_span_us``: first entry to last program done (the kernel's GPU time as its programs see it);
    ``tl_ramp_us``: first to last entry (how long the launch takes to start every program); ``tl_loop_p50_us``:
    median entry to end of the full-tile loop; ``tl_dur_p50_us`` / ``tl_dur_max_us``: entry to done;
    ``tl_done_p10_us`` .. ``tl_done_p90_us``: when programs finish; ``tl_tail_us``: the last finish after the median
    one (what the slowest programs add); ``tl_sms``: distinct SMs used.
    """
    n = len(start_ns)
    if not (n and n == len(loop_end_ns) == len(done_ns) == len(sm)):
        raise ValueError("timeline_stats needs equal, non-empty lists of entry, loop-end, done times and SMs")
    t0 = min(start_ns)
    us = lambda xs: sorted((x - t0) / 1e3 for x in xs)  # noqa: E731
    done = us(done_ns)
    dur = sorted((d - a) / 1e3 for a, d in zip(start_ns, done_ns))
    loop = sorted((b - a) / 1e3 for a, b in zip(start_ns, loop_end_ns))
    q = quantile  # the project's one quantile (linear interpolation)
    return {"tl_programs": n, "tl_span_us": done[-1], "tl_ramp_us": us(start_ns)[-1],
            "tl_start_p50_us": q(us(start_ns), 0.5), "tl_loop_p50_us": q(loop, 0.5), "tl_dur_p50_us": q(dur, 0.5),
            "tl_dur_max_us": dur[-1], "tl_done_p10_us": q(done, 0.1), "tl_done_p50_us": q(done, 0.5),
            "tl_done_p90_us": q(done, 0.9), "tl_tail_us": done[-1] - q(done, 0.5), "tl_sms": len(set(sm))}


#: A part whose fitted line explains less than this share of its time's variance over contexts (r²) does not grow
#: with the bytes: its measured differences are noise (run 7: the h8T8 empty pair fitted 1.1e7 GB/s at r² 0.43).
FLAT_R2 = 0.5


def anatomy_fits(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Per (heads, draft tokens, part): least squares ``us = fixed_us + kv_bytes / rate`` over the measured contexts.

    ``marginal_gbps`` is the rate of the bf16 KV bytes the case holds (n_kv x 1,152 B), as the kernel rows count
    them; parts whose time does not grow with the bytes (launches, the merge: a slope <= 0, or r² under
    :data:`FLAT_R2`) get a rate of inf and their mean as the fixed cost. ``r2`` is the line's. Shapes with fewer
    than two contexts are left out.
    """
    df = pd.DataFrame([r for r in rows if r.get("error") is None and r.get("us_median") is not None])
    if df.empty:
        return pd.DataFrame()
    out = []
    for (h, t, part), g in df.groupby(["heads", "draft_tokens", "part"], sort=False):
        if g["context_tokens"].nunique() < 2:
            continue
        fit = fit_line(list(g["kv_bytes"].astype(float)), list(g["us_median"].astype(float)))
        grows = fit.slope > 0 and fit.r2 >= FLAT_R2
        rate = 1e-3 / fit.slope if grows else float("inf")  # B/us -> GB/s: 1 B/us = 1e-3 GB/s
        out.append({"heads": int(h), "draft_tokens": int(t), "part": part, "contexts": int(g["context_tokens"].nunique()),
                    "fixed_us": fit.intercept if grows else float(g["us_median"].mean()),
                    "marginal_gbps": rate, "r2": fit.r2})
    return pd.DataFrame(out)


def fixed_cost_shares(fits: pd.DataFrame) -> pd.DataFrame:
    """Per shape: the full call's fixed cost beside what the parts explain (computed from :func:`anatomy_fits`).

    ``<part>_us`` is each timed part's fitted fixed cost (``empty_2_us``: two launches; the timeline has none);
    ``partial_over_read_us`` is what the partial kernel's math adds to the read-only kernel of the same grid
    (``read_gather_us``); ``pdl_saves_us`` = full - full_pdl. Where ``--ws`` measured them (:func:`measure_ws`),
    ``pick_over_read_ws_us`` is what the pick's math, epilogue and merge add to the read-only kernel of its own
    launch shape (``pick_ws_us`` - ``read_ws_us``).
    """
    out = []
    for (h, t), g in fits.groupby(["heads", "draft_tokens"], sort=False):
        f = dict(zip(g["part"], g["fixed_us"]))
        row = {"heads": h, "draft_tokens": t, **{f"{p}_us": f.get(p, float("nan")) for p in PARTS if p != "timeline"}}
        row["partial_over_read_us"] = row["partial_us"] - row["read_gather_us"]
        row["pdl_saves_us"] = row["full_us"] - row["full_pdl_us"]
        if all(p in f for p in WS_PARTS):
            row.update({f"{p}_us": f[p] for p in WS_PARTS})
            row["pick_over_read_ws_us"] = f["pick_ws"] - f["read_ws"]
        out.append(row)
    return pd.DataFrame(out)


# --- measurement (CUDA) -------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _kernels():
    """The two helper kernels, defined once on first use (the module imports without Triton; a new definition per
    call would re-run Triton's specialization every call: run 7 timed that, 2.4-4.4 ms, as the read kernel)."""
    import triton  # noqa: PLC0415
    import triton.language as tl  # noqa: PLC0415

    @triton.jit
    def _empty_kernel(X):
        pass

    @triton.jit
    def _read_kernel(KV, TOKEN_TABLE, OUT, n_kv, tokens_per_split, stride_kv,
                     CONTIG: tl.constexpr, BLOCK_N: tl.constexpr, D_NOPE: tl.constexpr, D_PE: tl.constexpr,
                     STAGES: tl.constexpr):
        pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
        start = tl.program_id(1) * tokens_per_split
        end = tl.minimum(start + tokens_per_split, n_kv)
        n_full = tl.maximum(end - start, 0) // BLOCK_N
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, D_NOPE)
        offs_pe = D_NOPE + tl.arange(0, D_PE)
        acc = tl.zeros([BLOCK_N], tl.float32)
        for it in tl.range(0, n_full, num_stages=STAGES):
            tile = start + it * BLOCK_N
            if CONTIG:
                slot = (tile + offs_n).to(tl.int64)
            else:
                slot = tl.load(TOKEN_TABLE + tile + offs_n)
            row = KV + slot[:, None].to(tl.int64) * stride_kv
            acc += tl.sum(tl.load(row + offs_d[None, :]).to(tl.float32), 1)  # along the row: within a thread
            acc += tl.sum(tl.load(row + offs_pe[None, :]).to(tl.float32), 1)
        tl.store(OUT + pid, tl.sum(acc, 0))

    return _empty_kernel, _read_kernel


def _is_sleep(kernel_name: str) -> bool:
    """torch.cuda._sleep's kernel (ATen's ``spin_kernel``), queued before profiled calls: not part of any call."""
    name = kernel_name.lower()
    return "spin_kernel" in name or "sleep" in name


#: one profiled GPU kernel: (name, start us, end us)
KernelSpan = tuple[str, float, float]


def kernel_spans(calls: Sequence[Callable[[], object]], n_runs: int, device: torch.device) -> list[KernelSpan]:
    """Every CUDA kernel of ``n_runs`` calls (rotating through ``calls`` as the timing does, so the KV is cold), in
    start order, from the torch profiler; a sleep queued first keeps launches ahead of the GPU and is left out."""
    from torch.autograd import DeviceType  # noqa: PLC0415
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    calls[0]()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(300_000 * n_runs)
        for i in range(n_runs):
            calls[(i + 1) % len(calls)]()
        torch.cuda.synchronize(device)
    evs = [e for e in prof.events() if e.device_type == DeviceType.CUDA and not _is_sleep(e.name)]
    return sorted(((e.name, float(e.time_range.start), float(e.time_range.end)) for e in evs), key=lambda k: k[1])


def split_call_stats(spans: Sequence[KernelSpan]) -> dict[str, float]:
    """A split call's two kernels and the gap between them (us, medians over the calls in ``spans``)."""
    part = [k for k in spans if "partial" in k[0]]
    merge = [k for k in spans if "merge" in k[0]]
    if not part or len(part) != len(merge):
        raise RuntimeError(f"profiler saw {len(part)} partial and {len(merge)} merge kernels")
    return {"prof_partial_us": statistics.median(e - s for _, s, e in part),
            "prof_merge_us": statistics.median(e - s for _, s, e in merge),
            "prof_gap_us": statistics.median(m[1] - p[2] for p, m in zip(part, merge)), "prof_calls": len(part)}


def call_kernel_stats(spans: Sequence[KernelSpan], n_runs: int) -> dict[str, Any]:
    """Every kernel one call launches (``spans`` of ``n_runs`` calls): per kernel name its median duration and
    launches per call, the call's span (first kernel's start to last kernel's end) and busy time, medians."""
    if not spans or len(spans) % n_runs:
        raise RuntimeError(f"profiler saw {len(spans)} kernels for {n_runs} calls: not a whole number per call")
    per_call = len(spans) // n_runs
    groups = [spans[i * per_call:(i + 1) * per_call] for i in range(n_runs)]
    names: dict[str, list[float]] = {}
    for name, start, end in spans:
        names.setdefault(name[:120], []).append(end - start)
    return {"prof_kernels": [{"name": n, "us_median": statistics.median(d), "per_call": len(d) // n_runs}
                             for n, d in names.items()],
            "prof_kernels_per_call": per_call,
            "prof_span_us": statistics.median(g[-1][2] - g[0][1] for g in groups),
            "prof_busy_us": statistics.median(sum(e - s for _, s, e in g) for g in groups)}


def profiled_kernel_us(calls: Sequence[Callable[[], object]], n_runs: int, device: torch.device) -> dict[str, float]:
    """GPU durations of a split call's two kernels and the gap between them (:func:`split_call_stats`)."""
    return split_call_stats(kernel_spans(calls, n_runs, device))


def profile_kernels(calls: Sequence[Callable[[], object]], n_runs: int, device: torch.device) -> dict[str, Any]:
    """Every GPU kernel one call launches (:func:`call_kernel_stats`). For kernels we did not write (an anchor's
    run), where its time goes."""
    return call_kernel_stats(kernel_spans(calls, n_runs, device), n_runs)


def read_kv(inputs: Any, sink: torch.Tensor, grid: tuple[int, int], tokens_per_split: int, cfg: Any,
            contig: bool) -> torch.Tensor:
    """The read-only kernel (module doc): program (i, s) sums the rows of split s's full KV tiles, through the token
    table (``contig`` False) or in slot order, into ``sink[s * grid[0] + i]`` (fp32)."""
    _, read_k = _kernels()
    read_k[grid](inputs.cache, inputs.token_table, sink, inputs.n_kv, tokens_per_split, inputs.cache.stride(0),
                 CONTIG=contig, BLOCK_N=cfg.block_n, D_NOPE=D_NOPE, D_PE=D_PE, STAGES=cfg.num_stages,
                 num_warps=cfg.num_warps)
    return sink


def measure_anchor(shape: VerifyShape, device: torch.device, n_runs: int = 20, rotate_bytes: int = 1 << 30,
                   seed: int = 0, profile_runs: int = 10) -> dict[str, Any]:
    """FlashInfer's MLA on the case (anchors.FlashInferMLA, planned outside the call), timed like the parts and
    profiled kernel by kernel: part ``flashinfer``."""
    from specdiag.kernels.anchors import FlashInferMLA  # noqa: PLC0415
    from specdiag.kernels.cases import relative_error, rotation_sets  # noqa: PLC0415
    from specdiag.kernels.reference import reference_verify  # noqa: PLC0415
    from specdiag.kernels.timing import summarize_ms, time_calls  # noqa: PLC0415

    inputs = make_inputs(shape, device=device, seed=seed, chain=True)
    sets = rotation_sets(inputs, rotate_bytes, seed)
    wrappers = [FlashInferMLA(s, 1) for s in sets]
    outs = [s.out_like() for s in sets]
    calls = [(lambda w=w, o=o: w(o)) for w, o in zip(wrappers, outs)]
    outs[0].fill_(float("nan"))
    calls[0]()
    torch.cuda.synchronize(device)
    err = relative_error(outs[0], reference_verify(inputs))
    ms = time_calls(calls, n_runs=n_runs, n_warmup=3, device=device)
    s = summarize_ms(ms)
    row: dict[str, Any] = {"rel_err": err, "correct": bool(err <= 1e-2), "us_median": 1e3 * s["ms_median"],
                           "us_p10": 1e3 * s["ms_p10"], "us_p90": 1e3 * s["ms_p90"], "n_runs": s["n_runs"],
                           "us_samples": [round(1e3 * x, 2) for x in ms], "mask": "chain"}
    row.update(profile_kernels(calls, profile_runs, device))
    return row


def ws_read_part(block_n: int, stages: int, round_tokens: int = BLOCK_TOKENS) -> str:
    """The part name of a read-only call with a ``block_n``-token ring of ``stages`` tiles, its splits a multiple of
    ``round_tokens``: ``read_ws`` for the pick's own (64 x 2, 64-token splits), ``read_ws_<block_n>x<stages>`` for
    another ring, ``..t<round_tokens>`` after it for another round (session 15: ``read_ws_64x2t1``)."""
    if (block_n, stages) == WS_PICK_RING and round_tokens == BLOCK_TOKENS:
        return "read_ws"
    return f"read_ws_{block_n}x{stages}" + ("" if round_tokens == BLOCK_TOKENS else f"t{round_tokens}")


def parse_ring_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"64x3,32x6,64x2t1"`` -> [(64, 3, 64), (32, 6, 64), (64, 2, 1)]: rings of ``block_n`` tokens x ``stages``
    tiles for ``--ws-read-shapes``, the splits a multiple of 64 tokens or of the ``t`` suffix's
    (``SplitKVConfig.split_round_tokens``). A ring holds at least two tiles (one landing while one drains) and fits an
    SM's shared memory: at most 192 tokens of 1,152 B rows (221 KB)."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        ring, sep, rnd = item.lower().partition("t")
        try:
            bn, st = (int(v) for v in ring.split("x"))
            round_tokens = int(rnd) if sep else BLOCK_TOKENS
        except ValueError:
            raise ValueError(f"ring shape {item!r} is not BLOCK_NxSTAGES[tROUND] (e.g. 64x3, 64x2t1)") from None
        if bn not in (16, 32, 64) or st < 2 or bn * st > 192:
            raise ValueError(f"ring shape {item!r}: block_n must be 16, 32 or 64, stages at least 2, and block_n x "
                             "stages at most 192 tokens (221 KB of shared memory)")
        if round_tokens < 1:
            raise ValueError(f"ring shape {item!r}: the splits' round must be at least 1 token")
        out.append((bn, st, round_tokens))
    return out


def measure_ws(shape: VerifyShape, device: torch.device, n_runs: int = 20, rotate_bytes: int = 1 << 30,
               seed: int = 0, pick: str = "split_gwsw8_p1",
               read_rings: Sequence[tuple[int, ...]] = ()) -> list[dict[str, Any]]:
    """The pick's call and the read-only kernel of its launch shape (gluon_ws_read: the same grid, shared memory,
    split, ring and copies, no math), timed like the parts on the same rotating inputs: parts ``read_ws`` (each
    program's tile count checked against the plan) and ``pick_ws`` (checked against fp32); then the read-only kernel
    with each other ring of ``read_rings`` ((block_n, stages[, round_tokens]): more bytes in flight per SM, or the
    splits cut at another round; parts ``read_ws_<block_n>x<stages>[t<round>]``, :func:`ws_read_part`, each row with
    its own plan's splits). CUDA sm_90 only; a part that fails is a row with its error."""
    from specdiag.kernels.cases import relative_error, rotation_sets  # noqa: PLC0415
    from specdiag.kernels.dispatch import prepared_call  # noqa: PLC0415
    from specdiag.kernels.gluon_ws_read import expected_tiles, read_kv_ws, read_plan, read_sink  # noqa: PLC0415
    from specdiag.kernels.reference import reference_verify  # noqa: PLC0415
    from specdiag.kernels.timing import summarize_ms, time_calls  # noqa: PLC0415

    inputs = make_inputs(shape, device=device, seed=seed)
    sets = rotation_sets(inputs, rotate_bytes, seed)
    plan = read_plan(inputs)
    base = {"context_tokens": shape.context_tokens, "heads": shape.heads, "draft_tokens": shape.draft_tokens,
            "layout": shape.layout, "n_kv": shape.n_kv, "kv_bytes": kv_bytes(shape.n_kv), "n_tiles": plan.n_tiles,
            "n_splits": plan.n_splits, "tokens_per_split": plan.tokens_per_split, "grid": [plan.n_tiles, plan.n_splits],
            "n_rotation_sets": len(sets)}
    outs = [s.out_like() for s in sets]
    # the pick's ring first, each ring once, as (block_n, stages, round_tokens)
    rings = {ws_read_part(*r): r for r in [(*WS_PICK_RING, BLOCK_TOKENS),
                                           *((r[0], r[1], r[2] if len(r) > 2 else BLOCK_TOKENS) for r in read_rings)]}
    sinks = {part: [read_sink(s, bn, st, round_tokens=rnd) for s in sets] for part, (bn, st, rnd) in rings.items()}
    calls = {"pick_ws": [prepared_call(pick, s, o) for s, o in zip(sets, outs)],
             **{part: [(lambda s=s, k=k, r=r: read_kv_ws(s, k, r[0], r[1], round_tokens=r[2]))
                       for s, k in zip(sets, sinks[part])]
                for part, r in rings.items()}}
    rows: list[dict[str, Any]] = []
    for part in [*WS_PARTS, *(p for p in rings if p not in WS_PARTS)]:
        row: dict[str, Any] = {**base, "part": part, "kernel": pick if part == "pick_ws" else "gluon_ws_read",
                               "error": None, "ts_unix_s": time.time()}
        if part in rings:
            bn, st, rnd = rings[part]
            own = read_plan(inputs, bn, st, round_tokens=rnd)
            row.update(block_n=bn, stages=st, round_tokens=rnd, n_splits=own.n_splits,
                       tokens_per_split=own.tokens_per_split, grid=[own.n_tiles, own.n_splits])
        try:
            calls[part][0]()
            torch.cuda.synchronize(device)
            if part in rings:
                sink = sinks[part][0]
                want = expected_tiles(sets[0], bn, st, round_tokens=rnd)
                row["tiles_ok"] = bool(sink[:, 0].tolist() == want and bool((sink == sink[:, :1]).all()))
                row["correct"] = row["tiles_ok"]
            else:
                outs[0].fill_(float("nan"))
                calls[part][0]()
                torch.cuda.synchronize(device)
                row["rel_err"] = relative_error(outs[0], reference_verify(sets[0]))
                row["correct"] = bool(row["rel_err"] <= 1e-2 and not torch.isnan(outs[0]).any())
            ms = time_calls(calls[part], n_runs=n_runs, n_warmup=3, device=device)
            st = summarize_ms(ms)
            row.update(us_median=1e3 * st["ms_median"], us_p10=1e3 * st["ms_p10"], us_p90=1e3 * st["ms_p90"],
                       n_runs=st["n_runs"], us_samples=[round(1e3 * x, 2) for x in ms])
        except Exception as exc:  # noqa: BLE001 - a part that fails is a row; the other still runs
            row["error"] = repr(exc)[:500]
        rows.append(row)
    row = {**base, "part": "timeline_ws", "kernel": "gluon_ws_read", "block_n": WS_PICK_RING[0],
           "stages": WS_PICK_RING[1], "error": None, "ts_unix_s": time.time()}
    try:
        row.update(measure_ws_timeline(sets, n_runs, device))
    except Exception as exc:  # noqa: BLE001 - the timeline's failure is a row
        row["error"] = repr(exc)[:500]
    rows.append(row)
    return rows


def timeline_runs_summary(runs: Sequence[tuple[Mapping[str, Any], Sequence[Sequence[int]]]],
                          stamps: Sequence[str]) -> dict[str, Any]:
    """Timed launches summed up: ``runs`` holds each launch's stats and its per-program rows (``stamps`` in ns, then the
    SM). The median of each stat over the launches, ``tl_runs``, and ``tl_raw``: the median-span launch's rows as
    ``<stamp>_us`` from its first program's first stamp, and ``sm``."""
    out: dict[str, Any] = {k: statistics.median(r[0][k] for r in runs) for k in runs[0][0]}
    mid = sorted(runs, key=lambda r: r[0]["tl_span_us"])[len(runs) // 2][1]
    t0 = min(r[0] for r in mid)
    out["tl_runs"] = len(runs)
    out["tl_raw"] = {**{f"{name}_us": [round((r[k] - t0) / 1e3, 3) for r in mid] for k, name in enumerate(stamps)},
                     "sm": [r[len(stamps)] for r in mid]}
    return out


def ws_timeline_stats(table: Sequence[Sequence[int]]) -> dict[str, Any]:
    """One timed read launch (gluon_ws_read ``TIMELINE_COLUMNS`` rows: start, first tile landed, loop end, done ns,
    SM) as :func:`timeline_stats`, plus when each program's first tile lands after its start (``tl_first_p50_us``,
    ``tl_first_max_us``: the stream's start latency, index load then row copies) and each program's loop from its
    first tile to its last (``tl_stream_p50_us``)."""
    if not table:
        raise ValueError("ws_timeline_stats needs one row per program")
    start, first, loop_end, done, sm = (list(c) for c in zip(*table))
    out = timeline_stats(start, loop_end, done, sm)
    lat = sorted((f - a) / 1e3 for a, f in zip(start, first))
    stream = sorted((e - f) / 1e3 for f, e in zip(first, loop_end))
    out.update(tl_first_p50_us=quantile(lat, 0.5), tl_first_max_us=lat[-1], tl_stream_p50_us=quantile(stream, 0.5))
    return out


def measure_ws_timeline(sets: Sequence[Any], n_runs: int, device: torch.device) -> dict[str, Any]:
    """``n_runs`` timed launches of the pick's read floor (gluon_ws_read with its timeline, rotating ``sets``) back to
    back behind a sleep, as :func:`measure_timeline` does for split_p1: the median of each
    :func:`ws_timeline_stats` field and the raw per-program times (us from the first start) of the median-span run."""
    from specdiag.kernels.gluon_ws_read import read_kv_ws, read_sink, timeline_buffer  # noqa: PLC0415

    sinks = [read_sink(s) for s in sets]
    bufs = [timeline_buffer(sets[0]) for _ in range(n_runs)]
    read_kv_ws(sets[0], sinks[0], timeline=bufs[0])
    torch.cuda.synchronize(device)
    torch.cuda._sleep(300_000 * n_runs)
    for i, b in enumerate(bufs):
        k = (i + 1) % len(sets)
        read_kv_ws(sets[k], sinks[k], timeline=b)
    torch.cuda.synchronize(device)
    return timeline_runs_summary([(ws_timeline_stats(t), t) for t in (b.cpu().tolist() for b in bufs)],
                                 ("start", "first_tile", "loop_end", "done"))


def measure_case(shape: VerifyShape, device: torch.device, n_runs: int = 20, rotate_bytes: int = 1 << 30,
                 seed: int = 0, profile_runs: int = 10, num_sms: Optional[int] = None,
                 dtype: torch.dtype = torch.bfloat16) -> list[dict[str, Any]]:
    """Rows of every part of :data:`PARTS` on one case (module doc); a part that fails is a row with its error.

    ``num_sms`` (default: the device's) and ``dtype`` (fp16 under Triton's interpreter, which has no bf16) are for
    tests; the profile needs CUDA (``profile_runs`` 0 skips it)."""
    from specdiag.kernels.cases import relative_error, rotation_sets  # noqa: PLC0415
    from specdiag.kernels.dispatch import resolve_config  # noqa: PLC0415
    from specdiag.kernels.reference import reference_verify  # noqa: PLC0415
    from specdiag.kernels.splitkv_plan import default_config, plan_splits  # noqa: PLC0415
    from specdiag.kernels.timing import summarize_ms, time_calls  # noqa: PLC0415
    from specdiag.kernels.triton_splitkv import merge_partials, sm_count, split_kv_triton  # noqa: PLC0415

    empty_k, _ = _kernels()
    inputs = make_inputs(shape, device=device, seed=seed)
    if dtype != inputs.q.dtype:
        from specdiag.kernels.mla import VerifyInputs  # noqa: PLC0415

        inputs = VerifyInputs(q=inputs.q.to(dtype), cache=inputs.cache.to(dtype), token_table=inputs.token_table,
                              block_table=inputs.block_table, mask=inputs.mask, n_prefix=inputs.n_prefix,
                              sm_scale=inputs.sm_scale)
    sets = rotation_sets(inputs, rotate_bytes, seed)
    cfg = default_config(shape.rows)
    cfg_pdl = resolve_config("split_pdl_p1", shape.rows)
    num_sms = num_sms or sm_count(device.index or 0)
    plan = plan_splits(shape.rows, shape.n_kv, cfg, num_sms)
    grid = (plan.n_tiles * cfg.dv_split, plan.n_splits)
    merge_grid = (shape.rows, 512 // cfg.merge_block_dv)
    outs = [s.out_like() for s in sets]
    sink = torch.empty(grid[0] * grid[1], device=device, dtype=torch.float32)
    o_parts = [torch.empty(plan.n_splits, shape.rows, 512, device=device, dtype=torch.float32) for _ in sets]
    lse_parts = [torch.empty(plan.n_splits, shape.rows, device=device, dtype=torch.float32) for _ in sets]
    ref = reference_verify(inputs)

    def read(s, contig: bool):
        read_kv(s, sink, grid, plan.tokens_per_split, cfg, contig)

    def partial_into(i: int) -> None:
        """The partial kernel into set i's own partial buffers (what merge_partials then reads)."""
        split_kv_triton(sets[i], outs[i], page_size=1, cfg=cfg, num_sms=num_sms, partial_only=True,
                        o_part=o_parts[i], lse_part=lse_parts[i])

    calls: dict[str, list[Callable[[], object]]] = {
        "empty_1": [lambda: empty_k[grid](sink)],
        "empty_2": [lambda: (empty_k[grid](sink), empty_k[merge_grid](sink))],
        "read_torch": [(lambda s=s: torch.sum(s.cache[:shape.n_kv], dtype=torch.float32)) for s in sets],
        "read_gather": [(lambda s=s: read(s, False)) for s in sets],
        "read_contig": [(lambda s=s: read(s, True)) for s in sets],
        "partial": [(lambda i=i: partial_into(i)) for i in range(len(sets))],
        "merge": [(lambda i=i, o=o: merge_partials(o_parts[i], lse_parts[i], o, cfg)) for i, o in enumerate(outs)],
        "full": [(lambda s=s, o=o: split_kv_triton(s, o, page_size=1, cfg=cfg, num_sms=num_sms)) for s, o in zip(sets, outs)],
        "full_pdl": [(lambda s=s, o=o: split_kv_triton(s, o, page_size=1, cfg=cfg_pdl, num_sms=num_sms)) for s, o in zip(sets, outs)],
    }
    base = {"context_tokens": shape.context_tokens, "heads": shape.heads, "draft_tokens": shape.draft_tokens,
            "layout": shape.layout, "n_kv": shape.n_kv, "kv_bytes": kv_bytes(shape.n_kv), "config": cfg.as_dict(),
            "n_tiles": plan.n_tiles, "n_splits": plan.n_splits, "tokens_per_split": plan.tokens_per_split,
            "grid": list(grid), "merge_grid": list(merge_grid), "n_rotation_sets": len(sets)}
    rows: list[dict[str, Any]] = []
    for part in PARTS:
        row: dict[str, Any] = {**base, "part": part, "error": None, "ts_unix_s": time.time()}
        if part == "timeline":
            if device.type != "cuda":
                row["skipped"] = "the timeline reads %globaltimer (inline PTX): CUDA only"
            else:
                try:
                    row.update(measure_timeline(sets, cfg, num_sms, n_runs, device))
                except Exception as exc:  # noqa: BLE001
                    row["error"] = repr(exc)[:500]
            rows.append(row)
            continue
        try:
            if part == "merge":  # partials of every set written once, then the merge alone
                for i in range(len(sets)):
                    partial_into(i)
            if part in ("full", "full_pdl"):
                outs[0].fill_(float("nan"))
                calls[part][0]()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                row["rel_err"] = relative_error(outs[0], ref)
                row["correct"] = bool(row["rel_err"] <= 1e-2 and not torch.isnan(outs[0]).any())
            ms = time_calls(calls[part], n_runs=n_runs, n_warmup=3, device=device)
            s = summarize_ms(ms)
            row.update(us_median=1e3 * s["ms_median"], us_p10=1e3 * s["ms_p10"], us_p90=1e3 * s["ms_p90"],
                       n_runs=s["n_runs"], us_samples=[round(1e3 * x, 2) for x in ms])
            if part == "full" and profile_runs and device.type == "cuda":
                try:
                    row.update(profiled_kernel_us(calls[part], profile_runs, device))
                except Exception as exc:  # noqa: BLE001 - the timing stands without the profile
                    row["prof_error"] = repr(exc)[:300]
        except Exception as exc:  # noqa: BLE001 - a part that fails is a row; the others still run
            row["error"] = repr(exc)[:500]
        rows.append(row)
    return rows


def measure_timeline(sets: Sequence[Any], cfg: Any, num_sms: int, n_runs: int, device: torch.device) -> dict[str, Any]:
    """``n_runs`` partial launches with the timeline (rotating ``sets``), back to back behind a sleep; the median of
    each :func:`timeline_stats` field, and the raw per-program times (us from the first entry) of the run with the
    median span."""
    from specdiag.kernels.splitkv_plan import plan_splits  # noqa: PLC0415
    from specdiag.kernels.triton_splitkv import split_kv_triton  # noqa: PLC0415

    first = sets[0]
    plan = plan_splits(first.heads * first.draft_tokens, first.n_kv, cfg, num_sms)
    bufs = [torch.zeros(plan.n_tiles * cfg.dv_split * plan.n_splits, 4, device=device, dtype=torch.int64)
            for _ in range(n_runs)]
    outs = [s.out_like() for s in sets]
    split_kv_triton(first, outs[0], page_size=1, cfg=cfg, num_sms=num_sms, partial_only=True, timeline=bufs[0])
    torch.cuda.synchronize(device)
    torch.cuda._sleep(300_000 * n_runs)
    for i, b in enumerate(bufs):
        k = (i + 1) % len(sets)
        split_kv_triton(sets[k], outs[k], page_size=1, cfg=cfg, num_sms=num_sms, partial_only=True, timeline=b)
    torch.cuda.synchronize(device)
    runs = [(timeline_stats(*(list(c) for c in zip(*a))), a) for a in (b.cpu().tolist() for b in bufs)]
    return timeline_runs_summary(runs, ("start", "loop_end", "done"))


def parse_cases(text: str, layout: str) -> list[VerifyShape]:
    """``context:heads:draft_tokens`` items, comma-separated, as VerifyShapes on ``layout``."""
    shapes = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        parts = item.split(":")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"case {item!r}: write context:heads:draft_tokens, e.g. 131072:8:1")
        shapes.append(VerifyShape(int(parts[0]), int(parts[1]), int(parts[2]), layout))
    if not shapes:
        raise ValueError("no cases given: --cases 16384:8:1,131072:8:1")
    return shapes


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdiag.kernels.anatomy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="run folder (created if absent; rows appended to kernel_anatomy)")
    ap.add_argument("--cases", required=True, help="context:heads:draft_tokens, comma-separated")
    ap.add_argument("--layout", default="shuffled_p1", choices=["contiguous", "shuffled_p1"])
    ap.add_argument("--n-runs", type=int, default=20)
    ap.add_argument("--max-minutes", type=float, default=None, help="stop starting cases after this long")
    ap.add_argument("--flashinfer", action="store_true",
                    help="also time and profile FlashInfer's MLA on each case (part flashinfer; needs flashinfer)")
    ap.add_argument("--ws", action="store_true",
                    help="also time the pick (split_gwsw8_p1) and the read-only kernel of its launch shape on each case "
                         "(parts read_ws and pick_ws; CUDA sm_90)")
    ap.add_argument("--ws-read-shapes", default="",
                    help="with --ws: also the read-only kernel with these rings, BLOCK_NxSTAGES[tROUND] comma-separated "
                         "(e.g. 64x3,32x6: more bytes in flight per SM; 64x2t1: the pick's ring, the splits equal "
                         "shares of tokens; parts read_ws_<BLOCK_N>x<STAGES>[t<ROUND>])")
    ap.add_argument("--peaks", action="store_true",
                    help="measure the copy and matmul ceilings and a copy of each context's KV bytes first (the "
                         "harness's peaks and kernel_ab_copy; use when the folder has no harness run)")
    args = ap.parse_args(argv)
    shapes = parse_cases(args.cases, args.layout)  # bad input fails before the GPU is touched
    try:
        read_rings = parse_ring_shapes(args.ws_read_shapes)
    except ValueError as exc:
        ap.error(f"--ws-read-shapes: {exc}")
    if read_rings and not args.ws:
        ap.error("--ws-read-shapes times the read-only kernel beside the pick: add --ws")
    if not torch.cuda.is_available():
        print("the anatomy times CUDA kernels: no CUDA device here", file=sys.stderr)
        return 2
    from tqdm import tqdm  # noqa: PLC0415

    from specdiag.runs import Run  # noqa: PLC0415

    from specdiag.kernels.harness import device_provenance, measure_copy_by_size, measure_peaks  # noqa: PLC0415

    run = Run.create(args.out, label="kernel-anatomy")
    t0 = time.monotonic()
    device = torch.device("cuda")
    command = " ".join([os.path.basename(sys.executable), "-m", "specdiag.kernels.anatomy", *(argv or sys.argv[1:])])
    run.update(anatomy_command=command, anatomy_cases=args.cases)
    if args.peaks:  # the copy and matmul ceilings and a copy of each context's bytes, in the same process
        if not run.meta.get("device"):
            run.update(kind="kernel_anatomy", device=device_provenance(device))
        peaks = measure_peaks(device)
        peaks["sm_count"] = torch.cuda.get_device_properties(device).multi_processor_count
        run.update(peaks=dict(peaks))
        measure_copy_by_size(run, sorted({s.context_tokens for s in shapes}), device)
        print(f"peaks: copy {peaks['copy_gbps']:.0f} GB/s, bf16 matmul {peaks['matmul_tflops']:.0f} TFLOP/s", flush=True)
    for shape in tqdm(shapes, desc="anatomy cases", file=sys.stdout):
        if args.max_minutes and time.monotonic() - t0 > 60 * args.max_minutes:
            run.append_row(TABLE, {"context_tokens": shape.context_tokens, "heads": shape.heads,
                                   "draft_tokens": shape.draft_tokens, "part": None, "error": None,
                                   "skipped": "time budget used up; this case and the rest were not measured"})
            break
        rows = measure_case(shape, device, n_runs=args.n_runs)
        if args.flashinfer:
            fi: dict[str, Any] = {**{k: rows[0][k] for k in ("context_tokens", "heads", "draft_tokens", "layout", "n_kv",
                                                             "kv_bytes")}, "part": "flashinfer", "error": None,
                                  "ts_unix_s": time.time()}
            try:
                fi.update(measure_anchor(shape, device, n_runs=args.n_runs))
            except Exception as exc:  # noqa: BLE001 - the anchor's failure is a row
                fi["error"] = repr(exc)[:500]
            rows.append(fi)
        if args.ws:
            rows += measure_ws(shape, device, n_runs=args.n_runs, read_rings=read_rings)
        for row in rows:
            run.append_row(TABLE, row)
            print(f"P={shape.context_tokens:>6} H={shape.heads:>3} T={shape.draft_tokens:>2} {row['part']:<12} "
                  + (f"{row['us_median']:8.1f} us" if row.get("us_median") is not None else
                     f"span {row['tl_span_us']:.1f} ramp {row['tl_ramp_us']:.1f} dur p50 {row['tl_dur_p50_us']:.1f} "
                     f"max {row['tl_dur_max_us']:.1f} loop p50 {row['tl_loop_p50_us']:.1f} done p10/p50/p90 "
                     f"{row['tl_done_p10_us']:.1f}/{row['tl_done_p50_us']:.1f}/{row['tl_done_p90_us']:.1f} tail "
                     f"{row['tl_tail_us']:.1f} us, {row['tl_sms']} SMs" if "tl_span_us" in row else
                     f"skipped: {row.get('skipped')}" if row.get("skipped") else f"error {row['error']}")
                  + ("".join(f"\n    {k['per_call']} x {k['us_median']:7.1f} us  {k['name'][:90]}" for k in row["prof_kernels"])
                     + f"\n    span {row['prof_span_us']:.1f} us, busy {row['prof_busy_us']:.1f} us"
                     if "prof_kernels" in row else "")
                  + (f"  prof partial {row['prof_partial_us']:.1f} merge {row['prof_merge_us']:.1f} gap "
                     f"{row['prof_gap_us']:.1f} us" if "prof_partial_us" in row else ""), flush=True)
        torch.cuda.empty_cache()
    run.update(anatomy_finished_utc=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    fits = anatomy_fits(run.rows(TABLE))
    if not fits.empty:
        print(fits.to_string(index=False))
        print(fixed_cost_shares(fits).T.to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
