"""02's view inside a decode step: a GPU/CPU timeline of a few consecutive steps of a torch profiler trace.

A run folder may hold SGLang torch profiler traces (``profiles/*.trace.json.gz``, from ``POST /start_profile``
with CPU + GPU activities and Python stacks) and the per-step rows computed from them (``step_profile.jsonl``,
:mod:`specdiag.telemetry.torch_trace`). For each trace this module cuts the steps as torch_trace does and draws
``n_steps`` consecutive complete verify steps: one lane per GPU kernel class (the union of that class's ops,
the colours of :func:`specdiag.plots.kernel_class_color`, as in 08's step-profile view), one lane for the CPU phases (torch_trace's phase table; phases nest, so the
lane shows the innermost phase the scheduler thread was in), the step boundaries, and x in ms from the first
drawn step's start (the trace's own clock). The summary row of a trace is computed over all its complete steps:
the median of ``gpu_busy_ms / wall_ms`` per step, and the kernel class with the largest median ms per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from specdiag import plots
from specdiag.findings import Finding
from specdiag.stats import quantile
from specdiag.telemetry import torch_trace as tt
from specdiag.telemetry.intervals import innermost_segments, union_us
from specdiag.telemetry.trace_tables import CPU_PHASES

if TYPE_CHECKING:
    from specdiag.runs import Run

#: Colours of the CPU phases (torch_trace's phase table); a phase not listed is grey.
PHASE_COLORS = {"ngram_prepare": "#fdd0a2", "ngram_draft": "#fd8d3c", "ngram_corpus_sync": "#7f2704",
                "ngram_corpus_get": "#d94801", "ngram_corpus_update": "#756bb1", "target_forward": "#6baed6",
                "sample": "#31a354", "kv_move": "#a1d99b", "process_result": "#bcbddc", "schedule": "#969696",
                "recv": "#d9d9d9"}
#: The lane of every GPU op together, drawn above the class lanes.
ALL_GPU = "GPU: any op"
CPU_LANE = "CPU: phase"
TRACE_GLOB = "*.trace.json*"


@dataclass(frozen=True)
class TraceRef:
    """One trace of a run folder and what is known of it (from the step_profile rows that name it)."""

    path: Path
    arm: str
    context_tokens: int | None  # None: no step_profile row names the trace, so its context is not recorded
    marker: str | None = None  # the step marker regex its rows were cut with (None: torch_trace's default)


@dataclass(frozen=True)
class TraceTimeline:
    """What the figure draws, times in ms from ``origin_us`` (the first drawn step's start)."""

    ref: TraceRef
    steps: tuple[int, ...]  # the step numbers drawn
    origin_us: float
    boundaries_ms: tuple[float, ...]  # each drawn step's start, then the last one's end
    gpu_lanes: dict[str, list[tuple[float, float]]]  # ALL_GPU, then class -> merged op intervals, clipped
    cpu_segments: list[tuple[float, float, str]]  # (start, end, innermost phase), clipped
    summary: dict[str, Any] = field(default_factory=dict)


# --- pure pieces -------------------------------------------------------------------------------------
def pick_steps(rows: Sequence[Mapping[str, Any]], n_steps: int) -> list[int]:
    """The first ``n_steps`` consecutive rows that are complete verify steps (not partial, ``verify_step``),
    as step numbers; the longest such run when none is that long; [] when no step qualifies."""
    best: list[int] = []
    current: list[int] = []
    for r in rows:
        if r.get("partial") or not r.get("verify_step", True):
            current = []
            continue
        step = int(r["step"])
        current = current + [step] if current and step == current[-1] + 1 else [step]
        if len(current) > len(best):
            best = current
        if len(best) >= n_steps:
            return best[:n_steps]
    return best


def clip_ms(intervals: Sequence[tuple[float, float]], lo_us: float, hi_us: float,
            origin_us: float) -> list[tuple[float, float]]:
    """Intervals in µs cut to [lo_us, hi_us], merged where they touch, as ms from ``origin_us``."""
    cut = sorted((max(s, lo_us), min(e, hi_us)) for s, e in intervals if e > lo_us and s < hi_us)
    merged: list[tuple[float, float]] = []
    for s, e in cut:
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        elif e > s:
            merged.append((s, e))
    return [((s - origin_us) / 1e3, (e - origin_us) / 1e3) for s, e in merged]


def step_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Over the complete steps (torch_trace's :func:`~specdiag.telemetry.torch_trace.summarize`): the median
    GPU busy share of the step's wall time (per step ``gpu_busy_ms / wall_ms``, then the median), the median
    wall and busy ms, and the kernel class with the largest median ms per step."""
    s = tt.summarize(rows)
    used = [r for r in rows if not r.get("partial") and r.get("wall_ms")]
    out: dict[str, Any] = {"steps_found": s["steps_found"], "steps_counted": s["steps"]}
    if not s["steps"] or not used:
        return out | {"wall_ms": None, "gpu_busy_ms": None, "gpu_busy_pct": None, "largest_class": None,
                      "largest_class_ms": None}
    med = s["median"]
    by_class = {c: med.get(f"gpu_{c}_ms") or 0.0 for c in tt.class_names()}
    largest = max(by_class, key=lambda c: by_class[c])
    return out | {"wall_ms": med["wall_ms"], "gpu_busy_ms": med["gpu_busy_ms"],
                  "gpu_busy_pct": 100.0 * quantile([r["gpu_busy_ms"] / r["wall_ms"] for r in used], 0.5),
                  "largest_class": largest if by_class[largest] > 0 else None,
                  "largest_class_ms": by_class[largest]}


def unprofiled_step_ms(sweep_rows: Sequence[Mapping[str, Any]], context_tokens: int | None) -> float | None:
    """The median ``step_ms`` of the sweep's error-free rows at ``context_tokens`` (01's measurement, without
    the profiler); None when the sweep has none there."""
    got = [float(r["step_ms"]) for r in sweep_rows if context_tokens and r.get("context_tokens") == context_tokens
           and not r.get("error") and r.get("step_ms")]
    return quantile(got, 0.5) if got else None


def with_unprofiled(summary: Mapping[str, Any], step_ms: float | None) -> dict[str, Any]:
    """``summary`` with the unprofiled step time and the share of it the traced GPU work would fill (an
    estimate: the profiler stretches the CPU side, not the kernels)."""
    busy = summary.get("gpu_busy_ms")
    return {**summary, "unprofiled_step_ms": step_ms,
            "gpu_busy_pct_of_unprofiled_step": 100.0 * busy / step_ms if step_ms and busy is not None else None}


def summary_line(summary: Mapping[str, Any]) -> str:
    """One sentence per trace for the page."""
    where = f"{summary['arm']}, {context_label(summary.get('context_tokens'))}"
    if summary.get("gpu_busy_pct") is None:
        return f"{where}: no complete step in {summary['trace_file']}, nothing to summarize"
    largest = (f"largest kernel class {summary['largest_class']}, {summary['largest_class_ms']:.3f} ms per step"
               if summary.get("largest_class") else "no GPU op in the counted steps")
    return (f"{where}: GPU busy {summary['gpu_busy_pct']:.1f} % of the step's wall time (median over "
            f"{summary['steps_counted']} complete steps; median step {summary['wall_ms']:.2f} ms, GPU busy "
            f"{summary['gpu_busy_ms']:.3f} ms); {largest} (computed from the trace)"
            + (f". Without the profiler the sweep measured {summary['unprofiled_step_ms']:.2f} ms per verify step at "
               f"this context (sweep.jsonl): the same GPU work would fill {summary['gpu_busy_pct_of_unprofiled_step']:.0f} "
               "% of it (computed)" if summary.get("gpu_busy_pct_of_unprofiled_step") is not None else ""))


def context_label(context_tokens: int | None) -> str:
    return f"{plots.format_tokens(context_tokens)} context" if context_tokens else "context not recorded"


# --- from a trace to a timeline ------------------------------------------------------------------------
def build_timeline(events: Sequence[Mapping[str, Any]], ref: TraceRef, n_steps: int = 3) -> TraceTimeline:
    """The lanes, boundaries and summary of one trace (its events from torch_trace's ``load_trace``)."""
    ops = tt.gpu_ops(events)
    calls = tt.python_calls(events)
    rows = tt.step_breakdown(events, marker=ref.marker, ops=ops, calls=calls)
    windows = {w.step: w for w in tt.step_windows(events, ref.marker, ops, calls).windows}
    summary = {"arm": ref.arm, "context_tokens": ref.context_tokens, "trace_file": ref.path.name,
               **step_summary(rows)}
    chosen = pick_steps(rows, n_steps)
    summary["steps_drawn"] = chosen
    if not chosen:
        return TraceTimeline(ref, (), 0.0, (), {}, [], summary)
    lo, hi = windows[chosen[0]].start_us, windows[chosen[-1]].end_us
    lanes = {ALL_GPU: clip_ms([(o.start_us, o.end_us) for o in ops], lo, hi, lo)}
    for cls in tt.class_names():
        got = clip_ms([(o.start_us, o.end_us) for o in ops if o.kernel_class == cls], lo, hi, lo)
        if got:
            lanes[cls] = got
    phase_intervals = [(c.start_us, c.end_us, phase) for phase, cs in tt.phase_calls(calls).items() for c in cs
                       if c.end_us > lo and c.start_us < hi]
    cpu = [((max(s, lo) - lo) / 1e3, (min(e, hi) - lo) / 1e3, p)
           for s, e, p in innermost_segments(phase_intervals) if e > lo and s < hi]
    bounds = tuple((windows[i].start_us - lo) / 1e3 for i in chosen) + ((hi - lo) / 1e3,)
    drawn_busy_us = union_us((max(o.start_us, lo), min(o.end_us, hi)) for o in ops)
    summary["drawn_ms"] = (hi - lo) / 1e3
    summary["drawn_gpu_busy_ms"] = drawn_busy_us / 1e3
    return TraceTimeline(ref, tuple(chosen), lo, bounds, lanes, cpu, summary)


def find_traces(run: Run) -> tuple[list[TraceRef], list[str]]:
    """The run folder's traces: those its ``step_profile`` rows name (arm, context and marker from the rows),
    then any other ``profiles/*.trace.json*`` file (arm from run.json's ``arm.name``, context not recorded).
    Also the names of traces the rows name but the folder lacks."""
    profiles = run.path / "profiles"
    refs: dict[str, TraceRef] = {}
    missing: list[str] = []
    for r in run.rows(tt.STEP_PROFILE_TABLE):
        name = str(r.get("trace_file") or "")
        if not name or name in refs or name in missing:
            continue
        if (profiles / name).is_file():
            ctx = r.get("context_tokens")
            refs[name] = TraceRef(profiles / name, str(r.get("arm") or ""), int(ctx) if ctx else None, r.get("marker"))
        else:
            missing.append(name)
    arm = str((run.meta.get("arm") or {}).get("name") or "")
    for p in sorted(profiles.glob(TRACE_GLOB)) if profiles.is_dir() else []:
        refs.setdefault(p.name, TraceRef(p, arm, None))
    ordered = sorted(refs.values(), key=lambda t: (t.arm, t.context_tokens or 0, t.path.name))
    return ordered, missing


def run_timelines(run: Run, n_steps: int = 3) -> tuple[list[TraceTimeline], list[str]]:
    """Every trace of the run as a timeline, and lines saying what could not be drawn and why."""
    refs, missing = find_traces(run)
    notes = [f"step_profile.jsonl names {m} but profiles/{m} is not in {run.path.name}" for m in missing]
    run_arm = str((run.meta.get("arm") or {}).get("name") or "")
    sweep = run.rows("sweep")
    out = []
    for ref in refs:
        try:
            tl = build_timeline(tt.load_trace(ref.path), ref, n_steps)
        except tt.TraceError as exc:
            notes.append(f"{ref.path.name}: not drawn: {exc}")
            continue
        same_server = not run_arm or run_arm == ref.arm  # the sweep measured the run's own arm
        step_ms = unprofiled_step_ms(sweep, ref.context_tokens) if same_server else None
        out.append(replace(tl, summary=with_unprofiled(tl.summary, step_ms)))
    return out, notes


# --- the figure and the findings -------------------------------------------------------------------------
def plot_trace_timeline(tl: TraceTimeline) -> Any:
    """Lanes top to bottom: the CPU phase, every GPU op, then one lane per kernel class; dashed lines at the
    step boundaries, each step labelled with its number and wall time."""
    lanes = [CPU_LANE, *tl.gpu_lanes]
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.42 * len(lanes)))
    y = {lane: len(lanes) - 1 - i for i, lane in enumerate(lanes)}
    phases_seen: list[str] = []
    for s, e, p in tl.cpu_segments:
        ax.broken_barh([(s, e - s)], (y[CPU_LANE] - 0.4, 0.8), facecolors=PHASE_COLORS.get(p, "#bbbbbb"),
                       edgecolors=PHASE_COLORS.get(p, "#bbbbbb"), linewidth=0.3)
        if p not in phases_seen:
            phases_seen.append(p)
    for lane, spans in tl.gpu_lanes.items():
        color = "#333333" if lane == ALL_GPU else plots.kernel_class_color(lane)
        ax.broken_barh([(s, e - s) for s, e in spans], (y[lane] - 0.4, 0.8), facecolors=color, edgecolors=color,
                       linewidth=0.3)  # a 0.3 pt edge keeps µs-long kernels visible as hairlines
    for b in tl.boundaries_ms:
        ax.axvline(b, color="k", linestyle="--", linewidth=0.8)
    for i, step in enumerate(tl.steps):
        a, b = tl.boundaries_ms[i], tl.boundaries_ms[i + 1]
        ax.text((a + b) / 2, len(lanes) - 0.35, f"step {step}: {b - a:.2f} ms", ha="center", va="bottom", fontsize=8)
    ax.set_yticks([y[lane] for lane in lanes])
    ax.set_yticklabels(lanes)
    ax.set_ylim(-0.6, len(lanes) + 0.2)
    ax.set_xlim(0, tl.boundaries_ms[-1] if tl.boundaries_ms else 1)
    ax.set_xlabel("ms from the first drawn step's start (trace clock)")
    s = tl.summary
    ax.set_title(f"{tl.ref.arm or 'arm not recorded'}, {context_label(tl.ref.context_tokens)}: "
                 f"{len(tl.steps)} consecutive decode steps of {tl.ref.path.name}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    order = [p for p, _ in CPU_PHASES]
    phases_seen.sort(key=lambda p: order.index(p) if p in order else len(order))
    ax.legend([Patch(color=PHASE_COLORS.get(p, "#bbbbbb")) for p in phases_seen], [f"CPU {p}" for p in phases_seen],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, title="CPU lane (innermost phase)",
              title_fontsize=8)
    plots.source_note(ax, f"measured: torch profiler trace (CPU+GPU, Python stacks; the profiler slows the CPU "
                          f"side); drawn: GPU busy {s.get('drawn_gpu_busy_ms', 0):.2f} of {s.get('drawn_ms', 0):.2f} ms")
    fig.tight_layout()
    return fig


def trace_findings(summaries: Sequence[Mapping[str, Any]], idle_below_pct: float = 50.0) -> list[Finding]:
    """One finding per trace: the GPU idle for most of the traced step (below ``idle_below_pct`` busy, a
    warning: the step is host-side) or busy (info: kernel time bounds the step)."""
    out = []
    for s in summaries:
        if s.get("gpu_busy_pct") is None:
            continue
        key = f"{s['arm'] or 'run'}-{s['context_tokens'] or 'unknown'}"
        where = f"{s['arm'] or 'the run'} at {context_label(s.get('context_tokens'))}"
        busy = float(s["gpu_busy_pct"])
        ev = (summary_line(s),
              f"trace {s['trace_file']}; steps cut at the marker call, GPU ops counted in the step that launched them "
              "(specdiag.telemetry.torch_trace)")
        numbers = {k: s.get(k) for k in ("context_tokens", "steps_counted", "wall_ms", "gpu_busy_ms", "gpu_busy_pct",
                                         "largest_class", "largest_class_ms", "unprofiled_step_ms",
                                         "gpu_busy_pct_of_unprofiled_step")}
        if busy < idle_below_pct:
            out.append(Finding(f"utilization.trace_gpu_idle.{key}", f"Traced decode step, {where}: the GPU idles",
                               f"The GPU ran kernels for {busy:.0f} % of the traced step; the other "
                               f"{100 - busy:.0f} % is host-side work (the CPU lane shows which phase).", "warning",
                               ev, numbers, "computed"))
        else:
            out.append(Finding(f"utilization.trace_gpu_busy.{key}", f"Traced decode step, {where}: the GPU is busy",
                               f"The GPU ran kernels for {busy:.0f} % of the traced step, most of it "
                               f"{s.get('largest_class')}: kernel time, not the host, sets this step.", "info", ev,
                               numbers, "computed"))
    return out
