"""Where the warp-specialized kernel's tile goes, from a run's ``kernel_ws_phases`` rows (notebook 06, section 10; issue 13).

Pure functions from the rows :mod:`specdiag.kernels.ws_phases` writes (one per case, kernel and warpgroup: SM cycles
per KV tile of each phase of ``gluon_ws.PHASES`` and of the whole loop, medians over programs) to tables and a finding.
Nothing here measures.

- :func:`newest`: per case and kernel, the rows of the newest call (largest ``ts_unix_s``): a case measured again
  replaces its older rows.
- :func:`phase_table`: one row per case, kernel and warpgroup: cycles per tile of each phase, ``rest_cycles`` (the loop
  minus the sum of its phases' medians: clock reads and loop bookkeeping; medians of separate columns need not add up
  exactly), each phase's share of the loop (``<phase>_pct``), the largest phase, and what the clock reads cost the
  call (``clock_cost_pct`` = 100 (timed / untimed - 1), CUDA events).
- :func:`profiler_split`: per case and kernel with the torch profiler's columns (rows from run 23 on): the untimed call
  (CUDA events) beside the GPU time of the partial kernel, the gap and the merge kernel, and the merge + gap share of
  the call (``merge_gap_pct`` = 100 (gap + merge) / call).
- :func:`ws_phases_finding`: what dominates warpgroup 0's tile in the compute-bound case (most rows, H x T) and at
  8 heads x 8 draft tokens; :func:`ws_phases_metrics`: the section's numbers, machine-readable.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Optional

import pandas as pd

from specdiag.findings import Finding
from specdiag.kernels.gluon_ws import PHASES as _WS_PHASES
from specdiag.kernels.gluon_ws_fp8 import FP8_PHASES
from specdiag.plots import format_tokens

TABLE = "kernel_ws_phases"  # the table specdiag.kernels.ws_phases writes
CASE = ["context_tokens", "heads", "draft_tokens"]
KEY = [*CASE, "kernel"]
#: Each partition's phases: the bf16 kernels' two (gluon_ws.PHASES) and the fp8 kernel's converting warpgroup
#: (gluon_ws_fp8.FP8_PHASES; its warpgroup 0 is the pick's).
PHASES: dict[str, tuple[str, ...]] = {**_WS_PHASES, **FP8_PHASES}
#: Every phase of every warpgroup, in the kernels' order (``pv`` belongs to two).
ALL_PHASES: tuple[str, ...] = tuple(dict.fromkeys(p for names in PHASES.values() for p in names))
#: What each phase is, for tables and legends.
PHASE_LABELS: dict[str, str] = {
    "copy_wait": "wait for the tile's copy", "scores": "scores (Q K^T)", "softmax": "mask and softmax",
    "p_free_wait": "wait for P to be free", "publish": "publish P and factors", "pv": "P V (its half)",
    "p_ready_wait": "wait for P", "p_free": "free P", "buffer_wait": "wait for the buffer",
    "refill_issue": "issue the refill's copy", "rest": "rest of the loop (loop - sum of phases)",
    "stage_wait": "wait for the fp8 tile's copy", "free_wait": "wait for the fp16 buffer",
    "convert": "convert fp8 to fp16 (with the loads, direct form)",
}
PARTITION_LABELS: dict[str, str] = {"softmax_wg": "warpgroup 0 (softmax)", "copy_pv_wg": "warpgroup 1 (copy, P V)",
                                    "convert_wg": "converting warpgroup (fp8)"}
PROF_COLUMNS: tuple[str, ...] = ("prof_partial_us", "prof_gap_us", "prof_merge_us")
#: Rows (heads x draft tokens) from which a case is compute-bound, as issue 5's compute target counts them
#: (specdiag.kernels.analysis: >= 50 % of bf16 matmul where H x T >= 256).
COMPUTE_MIN_ROWS = 256


def measured(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """The rows that measured a warpgroup (no error, a partition named), as a DataFrame."""
    df = pd.DataFrame(list(rows))
    if df.empty or "partition" not in df:
        return pd.DataFrame()
    if "error" not in df:
        df["error"] = None
    return df[df["partition"].notna() & df["error"].isna()].reset_index(drop=True)


def newest(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Per case and kernel, the measured rows of its newest call (largest ``ts_unix_s``), sorted by kernel, heads x
    draft tokens and context."""
    df = measured(rows)
    if df.empty:
        return df
    last = df.groupby(KEY)["ts_unix_s"].transform("max")
    out = df[df["ts_unix_s"] == last].copy()
    out["rows"] = out["heads"] * out["draft_tokens"]
    return out.sort_values(["kernel", "rows", "heads", "context_tokens", "partition"],
                           key=lambda s: s.map({p: i for i, p in enumerate(PHASES)}) if s.name == "partition" else s,
                           kind="stable").reset_index(drop=True)


def phase_table(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per case, kernel and warpgroup of the newest calls (module doc): ``<phase>_cycles`` (NaN for the other
    warpgroup's phases), ``rest_cycles``, ``loop_cycles``, ``<phase>_pct`` of the loop, ``dominant_phase`` and
    ``dominant_pct``, ``untimed_us``, ``timed_us`` and ``clock_cost_pct``."""
    df = newest(rows)
    if df.empty:
        return pd.DataFrame()
    out = []
    for r in df.to_dict("records"):
        names = PHASES.get(r["partition"])
        if names is None:
            raise ValueError(f"kernel_ws_phases row with partition {r['partition']!r}: expected one of {list(PHASES)} "
                             "(gluon_ws.PHASES, gluon_ws_fp8.FP8_PHASES); a row of another kernel version cannot be "
                             "read here")
        t: dict[str, Any] = {k: r[k] for k in (*KEY, "partition", "rows", "programs", "tiles_per_program", "ts_unix_s")}
        loop = float(r["loop_cycles"])
        for p in ALL_PHASES:
            t[f"{p}_cycles"] = float(r[f"{p}_cycles"]) if p in names else math.nan
        t["rest_cycles"] = loop - sum(t[f"{p}_cycles"] for p in names)
        t["loop_cycles"] = loop
        for p in (*ALL_PHASES, "rest"):
            t[f"{p}_pct"] = 100 * t[f"{p}_cycles"] / loop
        top = max(names, key=lambda p: t[f"{p}_cycles"])
        t["dominant_phase"], t["dominant_pct"] = top, t[f"{top}_pct"]
        t["untimed_us"], t["timed_us"] = float(r["untimed_us"]), float(r["timed_us"])
        t["clock_cost_pct"] = 100 * (t["timed_us"] / t["untimed_us"] - 1)
        out.append(t)
    return pd.DataFrame(out)


def profiler_split(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Per case and kernel of the newest calls with the profiler's columns: ``call_us`` (untimed call, CUDA events),
    ``partial_us``, ``gap_us``, ``merge_us`` (GPU times, torch profiler) and ``merge_gap_pct`` (of the call). Empty when
    no newest row has them (rows before run 23)."""
    df = newest(rows)
    if df.empty or not set(PROF_COLUMNS) <= set(df.columns):
        return pd.DataFrame()
    df = df.dropna(subset=list(PROF_COLUMNS)).drop_duplicates(KEY)
    if df.empty:
        return pd.DataFrame()
    out = df[[*KEY, "rows", "untimed_us", *PROF_COLUMNS]].rename(
        columns={"untimed_us": "call_us", "prof_partial_us": "partial_us", "prof_gap_us": "gap_us",
                 "prof_merge_us": "merge_us"})
    out["merge_gap_pct"] = 100 * (out["gap_us"] + out["merge_us"]) / out["call_us"]
    return out.reset_index(drop=True)


#: Warpgroup 0's timeline of a timed call (ws_phases.timeline_from_phases, rows since session 11), in display order.
TIMELINE_COLUMNS: dict[str, str] = {
    "tl_span_us": "span (first entry to last done)", "tl_q_p50_us": "entry to start (Q, barriers)",
    "tl_first_p50_us": "entry to first tile", "tl_stream_p50_us": "first tile to loop end",
    "tl_epilogue_p50_us": "epilogue (partial stored)", "tl_tail_us": "tail (last done - median)",
    "tl_ramp_us": "ramp (last entry - first)"}


def timeline_table(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Per case and kernel of the newest calls whose warpgroup 0 row carries a timeline: ``timed_us`` (the timed call,
    CUDA events) and :data:`TIMELINE_COLUMNS` (us, medians over programs). Empty for rows before session 11."""
    df = newest(rows)
    cols = list(TIMELINE_COLUMNS)
    if df.empty or not set(cols) <= set(df.columns):
        return pd.DataFrame()
    df = df[df["partition"] == "softmax_wg"].dropna(subset=cols)
    return df[[*KEY, "timed_us", *cols]].reset_index(drop=True)


def case_name(ctx: int, h: int, t: int) -> str:
    return f"{format_tokens(ctx)} H={h} x T={t}"


def last_kernel(table: pd.DataFrame) -> Optional[str]:
    """The kernel of the newest row (the arm measured last), None for an empty table."""
    return None if table.empty else str(table.loc[table["ts_unix_s"].idxmax(), "kernel"])


def _wg0(table: pd.DataFrame, kernel: str) -> pd.DataFrame:
    return table[(table["kernel"] == kernel) & (table["partition"] == "softmax_wg")]


def _phases_text(r: Mapping[str, Any], n: int = 3) -> str:
    names = sorted(PHASES["softmax_wg"], key=lambda p: -r[f"{p}_cycles"])[:n]
    return ", ".join(f"{p} {r[f'{p}_cycles']:,.0f} ({r[f'{p}_pct']:.0f} %)" for p in names)


def ws_phases_finding(table: pd.DataFrame, prof: pd.DataFrame, kernel: str) -> Optional[Finding]:
    """What dominates warpgroup 0's tile of ``kernel``: in its compute-bound case (the most rows, H x T; the longest
    context among those) and at 8 heads x 8 draft tokens (every context measured), with the copy wait's share; the
    merge + gap share of the call where the profiler was run. None when the kernel has no warpgroup 0 rows."""
    w0 = _wg0(table, kernel)
    if w0.empty:
        return None
    big = w0.sort_values(["rows", "context_tokens"]).iloc[-1]
    h8t8 = w0[(w0["heads"] == 8) & (w0["draft_tokens"] == 8)].sort_values("context_tokens")
    bcase = case_name(int(big["context_tokens"]), int(big["heads"]), int(big["draft_tokens"]))
    bound = "compute-bound " if big["rows"] >= COMPUTE_MIN_ROWS else ""
    verdict = (f"In {kernel}'s {bound}case with the most rows ({bcase}, {int(big['rows']):,} rows) warpgroup 0's tile is "
               f"{big['loop_cycles']:,.0f} cycles, led by {big['dominant_phase']} ({big['dominant_pct']:.0f} %); it waits "
               f"for its copy {big['copy_wait_pct']:.0f} % of a tile.")
    numbers: dict[str, Any] = {"kernel": kernel, "compute_case": bcase, "compute_rows": int(big["rows"]),
                               "compute_loop_cycles": float(big["loop_cycles"]),
                               "compute_dominant_phase": big["dominant_phase"],
                               "compute_dominant_pct": float(big["dominant_pct"]),
                               "compute_copy_wait_pct": float(big["copy_wait_pct"])}
    cost = table[table["kernel"] == kernel]["clock_cost_pct"]
    ev = [f"{bcase}: warpgroup 0's loop {big['loop_cycles']:,.0f} cycles per tile over {big['tiles_per_program']:.0f} "
          f"tiles per program; largest phases {_phases_text(big)} (measured, %clock64, medians over "
          f"{int(big['programs'])} programs)."]
    if not h8t8.empty and not (h8t8.index == big.name).all():
        parts = []
        for _, r in h8t8.iterrows():
            name = format_tokens(int(r["context_tokens"]))
            parts.append(f"{r['copy_wait_pct']:.0f} % of a tile at {name}" if not parts else
                         f"{r['copy_wait_pct']:.0f} % at {name}")
            ev.append(f"{case_name(int(r['context_tokens']), 8, 8)}: warpgroup 0's loop {r['loop_cycles']:,.0f} cycles "
                      f"per tile; largest phases {_phases_text(r)} (measured).")
            numbers[f"h8t8_P{int(r['context_tokens'])}_copy_wait_pct"] = float(r["copy_wait_pct"])
            numbers[f"h8t8_P{int(r['context_tokens'])}_loop_cycles"] = float(r["loop_cycles"])
            numbers[f"h8t8_P{int(r['context_tokens'])}_dominant_phase"] = r["dominant_phase"]
        lead = h8t8.iloc[-1] if (h8t8["context_tokens"] != 131072).all() else h8t8[h8t8["context_tokens"] == 131072].iloc[0]
        verdict += (f" At H=8 x T=8 it waits for its copy {', '.join(parts)}; at "
                    f"{format_tokens(int(lead['context_tokens']))} its largest phase is {lead['dominant_phase']} "
                    f"({lead['dominant_pct']:.0f} % of {lead['loop_cycles']:,.0f} cycles).")
    ev.append(f"The timed kernel's clock reads cost {cost.min():.1f} to {cost.max():.1f} % of {kernel}'s call on these "
              "cases (timed over untimed call, CUDA events, computed): its phases read the design, not the untimed "
              "kernel's exact time.")
    numbers.update(clock_cost_pct_min=float(cost.min()), clock_cost_pct_max=float(cost.max()))
    p = prof[prof["kernel"] == kernel] if not prof.empty else prof
    if not p.empty:
        verdict += (" Beside the loop, the merge kernel and the gap before it take this share of the call: "
                    + ", ".join(f"{r.merge_gap_pct:.0f} % at {case_name(int(r.context_tokens), int(r.heads), int(r.draft_tokens))}"
                                for r in p.sort_values(["rows", "context_tokens"]).itertuples())
                    + ".")
        for r in p.itertuples():
            ev.append(f"{case_name(int(r.context_tokens), int(r.heads), int(r.draft_tokens))}: call {r.call_us:.1f} us "
                      f"(CUDA events) = partial kernel {r.partial_us:.1f} + gap {r.gap_us:.1f} + merge {r.merge_us:.1f} "
                      f"us (torch profiler GPU times) + {r.call_us - r.partial_us - r.gap_us - r.merge_us:.1f} us "
                      f"launch overhead; merge + gap {r.merge_gap_pct:.1f} % (computed).")
            numbers[f"P{int(r.context_tokens)} h{int(r.heads)} t{int(r.draft_tokens)} merge_gap_pct"] = float(r.merge_gap_pct)
    return Finding(id="kernel_ab.ws_phases", title=f"Where {kernel}'s tile goes (warp-specialized kernel, SM cycles)",
                   verdict=verdict, severity="info", evidence=ev, numbers=numbers, source="measured")


def _num(x: Any) -> Any:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(float(x)) else None


def ws_phases_metrics(table: pd.DataFrame, prof: pd.DataFrame, timeline: Optional[pd.DataFrame] = None) -> dict[str, Any]:
    """The section's numbers keyed ``<kernel> P<context> h<heads> t<draft>``: per warpgroup the loop cycles per tile,
    the largest phase and its share, each phase's cycles; the profiler split and warpgroup 0's timeline where present."""
    tiles: dict[str, Any] = {}
    for r in table.to_dict("records"):
        key = f"{r['kernel']} P{int(r['context_tokens'])} h{int(r['heads'])} t{int(r['draft_tokens'])}"
        tiles.setdefault(key, {})[r["partition"]] = {
            "loop_cycles": float(r["loop_cycles"]), "dominant_phase": r["dominant_phase"],
            "dominant_pct": float(r["dominant_pct"]), "tiles_per_program": float(r["tiles_per_program"]),
            "phases_cycles": {p: float(r[f"{p}_cycles"]) for p in PHASES[r["partition"]]},
            "rest_cycles": float(r["rest_cycles"])}
    return {
        "cases": int(len(table.drop_duplicates(KEY))) if not table.empty else 0,
        "clock_cost_pct_min": _num(table["clock_cost_pct"].min()) if not table.empty else None,
        "clock_cost_pct_max": _num(table["clock_cost_pct"].max()) if not table.empty else None,
        "kernels": sorted(set(table["kernel"])) if not table.empty else [],
        "tiles": tiles,
        "profiler": {f"{r.kernel} P{int(r.context_tokens)} h{int(r.heads)} t{int(r.draft_tokens)}":
                     {"call_us": _num(r.call_us), "partial_us": _num(r.partial_us), "gap_us": _num(r.gap_us),
                      "merge_us": _num(r.merge_us), "merge_gap_pct": _num(r.merge_gap_pct)}
                     for r in prof.itertuples()} if not prof.empty else {},
        "timeline": {f"{r['kernel']} P{int(r['context_tokens'])} h{int(r['heads'])} t{int(r['draft_tokens'])}":
                     {k: _num(r[k]) for k in ("timed_us", *TIMELINE_COLUMNS)}
                     for r in timeline.to_dict("records")} if timeline is not None and not timeline.empty else {},
    }
