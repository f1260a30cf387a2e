"""Where a server's decode step time goes, from a torch profiler chrome trace (pure Python: json, gzip).

SGLang 0.5.17 writes the trace on ``POST /start_profile`` (``{"output_dir": D, "num_steps": 12, "activities":
["CPU", "GPU"], "with_stack": true}``) with torch.profiler's ``export_chrome_trace`` to
``D/<profile_id>-TP-<rank>[-DECODE].trace.json.gz``. This module cuts it into steps and says, per step, how
much wall time the GPU spent in each kernel class and how much it sat idle while the CPU ran the
scheduler and the NGRAM drafter, and how long those CPU phases took. Use::

    python -m specdiag.telemetry.torch_trace TRACE [--marker REGEX] [--json OUT] \
        [--run RUN_DIR --context-tokens N --arm NAME]   # --run: also append the rows to RUN_DIR/step_profile.jsonl

    rows = step_breakdown(load_trace(path))   # one dict per step
    summary = summarize(rows)                 # medians over the complete steps

Definitions (all times from the trace's own clock, µs in the trace, ms in the rows):

- **Step**: one call of a marker Python function (``with_stack=True`` records each Python call as a
  ``python_function`` event named ``<path>(<line>): <function>``). Default marker: the NGRAM worker's
  ``forward_batch_generation``, else the scheduler's ``run_batch``
  (:data:`~specdiag.telemetry.trace_tables.DEFAULT_MARKERS`); the outermost call counts when they nest. A
  step's window runs from its marker's start to the next marker's start, so it includes the scheduler's work
  between two forwards. The last marker has no next one: its window ends at its own end or at the end of the
  last GPU op it launched, whichever is later; it is marked partial (the scheduler's time after it is not in
  the window). A first marker that was already running when the profiler started (an ancestor of torch's
  ``profiler.start`` call; failing that, one starting within :data:`ON_STACK_TOLERANCE_US` of the first Python
  event) is partial too. Partial steps stay in the rows, with a note, and are left out of :func:`summarize`.
- **A GPU op belongs to the step in whose window it was launched**: its ``cuda_runtime``/``cuda_driver``
  launch event, found through the shared ``correlation`` id (or the ``ac2g`` flow events; failing both,
  the op's own start). Kernels of a CUDA graph replay carry the graph launch's id.
- ``gpu_busy_ms``: the union of the step's GPU op intervals (kernels, memcpy, memset; all streams and
  devices of the file together). ``gpu_idle_ms = wall_ms - gpu_busy_ms``: negative when the GPU still runs
  a step's work after the next step began (an overlapped scheduler). ``gpu_idle_in_window_ms``: the
  window minus the union of every GPU op that ran inside it, whoever launched it.
- ``gpu_<class>_ms``: the step's busy time per kernel class
  (:data:`~specdiag.telemetry.trace_tables.KERNEL_CLASSES`). A moment when several ops run at once is shared
  equally among them, so the class columns add up to ``gpu_busy_ms`` exactly, and with ``gpu_idle_ms`` to
  ``wall_ms``.
- ``cpu_<phase>_ms``: the time of the phase's Python calls that start in the window, overlapping calls (a
  call nested in another of the same phase) counted once (:data:`~specdiag.telemetry.trace_tables.CPU_PHASES`).
  Phases nest in one another, so they do not add up. ``marker_ms``: the marker call's own duration.
- ``graph_launches``: CUDA graph launches (``cudaGraphLaunch``) in the window; ``gpu_ops``: GPU ops launched
  in it; ``verify_step``: whether it ran NGRAM's draft preparation or ``eagle_sample`` (a prefill through the
  same worker does not).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from specdiag.runs import Run
from specdiag.stats import quantile
from specdiag.telemetry import trace_tables as tt
from specdiag.telemetry.intervals import shared_by_label_us, union_us

if TYPE_CHECKING:
    from specdiag.runs import Run

#: A first marker call starting this close to the first Python event was on the stack at profiler start
#: (used only when the trace has no torch ``profiler.start`` call to tell it exactly).
ON_STACK_TOLERANCE_US = 50.0

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver", "hip_runtime")  # hip_runtime: the same on ROCm
TORCH_CATEGORIES = {"cpu_op", "python_function", "user_annotation", *LAUNCH_CATEGORIES, *GPU_CATEGORIES}


class TraceError(ValueError):
    """The trace cannot be analysed as asked (not a torch trace, no marker, no Python stacks)."""


@dataclass(frozen=True)
class GpuOp:
    start_us: float
    end_us: float
    launch_us: float  # when the CPU launched it (its own start when no launch event was found)
    name: str
    kernel_class: str


@dataclass(frozen=True)
class PyCall:
    start_us: float
    end_us: float
    name: str
    key: tuple[Any, Any, Any]  # (pid, tid, Python id)
    parent_key: tuple[Any, Any, Any] | None


@dataclass(frozen=True)
class StepWindow:
    step: int
    start_us: float
    end_us: float
    marker_ms: float  # the marker call's own duration
    partial: bool
    note: str


@dataclass(frozen=True)
class Steps:
    marker: str  # the regex that found the steps
    marker_name: str  # the Python function it matched (the first call's event name)
    windows: tuple[StepWindow, ...]


# --- loading ------------------------------------------------------------------------------------------
def load_trace(path: str | Path) -> list[dict[str, Any]]:
    """The ``traceEvents`` of a torch chrome trace (``.json`` or gzip-compressed ``.json.gz``)."""
    p = Path(path)
    raw = p.read_bytes()
    try:
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise TraceError(f"{p} is not a JSON (or gzipped JSON) chrome trace: {exc}. Pass the "
                         f"<profile_id>-TP-<rank>.trace.json.gz file that /start_profile wrote.") from exc
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{p} has no 'traceEvents' list: it is not a chrome trace from torch.profiler's "
                         "export_chrome_trace.")
    if not any(isinstance(e, dict) and e.get("cat") in TORCH_CATEGORIES for e in events):
        raise TraceError(f"{p} is a chrome trace but holds no torch profiler events (cpu_op, python_function, "
                         "kernel, cuda_runtime): record it with torch.profiler (SGLang's /start_profile).")
    return events


# --- events ---------------------------------------------------------------------------------------------
def _complete(events: Iterable[Mapping[str, Any]], categories: Iterable[str]) -> Iterable[Mapping[str, Any]]:
    cats = set(categories)
    return (e for e in events if e.get("ph") == "X" and e.get("cat") in cats and "ts" in e)


def python_calls(events: Iterable[Mapping[str, Any]]) -> list[PyCall]:
    """Every ``python_function`` event, sorted by start."""
    out = []
    for e in _complete(events, ["python_function"]):
        args = e.get("args") or {}
        pid, tid = e.get("pid"), e.get("tid")
        parent = args.get("Python parent id")
        out.append(PyCall(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), str(e.get("name", "")),
                          (pid, tid, args.get("Python id")), None if parent is None else (pid, tid, parent)))
    return sorted(out, key=lambda c: c.start_us)


def classify(name: str, category: str, kernel_classes: Sequence[tuple[str, str]] = tt.KERNEL_CLASSES) -> str:
    """The class of one GPU op: by category for memcpy/memset, else the first matching name pattern."""
    if category in tt.CATEGORY_CLASSES:
        return tt.CATEGORY_CLASSES[category]
    for cls, pattern in kernel_classes:
        if re.search(pattern, name):
            return cls
    return tt.OTHER_CLASS


def gpu_ops(events: Sequence[Mapping[str, Any]],
            kernel_classes: Sequence[tuple[str, str]] = tt.KERNEL_CLASSES) -> list[GpuOp]:
    """Every GPU kernel/memcpy/memset with its launch time and class, sorted by launch."""
    launch_by_corr: dict[Any, float] = {}
    for e in _complete(events, LAUNCH_CATEGORIES):
        corr = (e.get("args") or {}).get("correlation")
        if corr is not None:
            launch_by_corr[corr] = float(e["ts"])
    flow_start = {e.get("id"): float(e["ts"]) for e in events if e.get("ph") == "s" and "ts" in e}
    flow_end = {(e.get("pid"), e.get("tid"), float(e["ts"])): e.get("id") for e in events
                if e.get("ph") == "f" and "ts" in e}
    out = []
    class_of: dict[tuple[str, str], str] = {}  # kernel names repeat: classify each (name, category) once
    for e in _complete(events, GPU_CATEGORIES):
        start = float(e["ts"])
        corr = (e.get("args") or {}).get("correlation")
        launch = launch_by_corr.get(corr) if corr is not None else None
        if launch is None:
            launch = flow_start.get(flow_end.get((e.get("pid"), e.get("tid"), start)))
        name, cat = str(e.get("name", "")), str(e.get("cat"))
        if (name, cat) not in class_of:
            class_of[name, cat] = classify(name, cat, kernel_classes)
        out.append(GpuOp(start, start + float(e.get("dur", 0.0)), start if launch is None else launch, name,
                         class_of[name, cat]))
    return sorted(out, key=lambda o: o.launch_us)


# --- steps ------------------------------------------------------------------------------------------------------------
def _outermost(calls: Sequence[PyCall]) -> list[PyCall]:
    """Drop calls nested in an earlier call of the same list on the same thread."""
    out: list[PyCall] = []
    open_end: dict[tuple[Any, Any], float] = {}
    for c in sorted(calls, key=lambda c: (c.start_us, -c.end_us)):
        thread = c.key[:2]
        if c.start_us < open_end.get(thread, float("-inf")):
            continue
        out.append(c)
        open_end[thread] = c.end_us
    return out


def _find_markers(calls: Sequence[PyCall], marker: str | None) -> tuple[str, list[PyCall]]:
    if not calls:
        raise TraceError("the trace has no python_function events, so steps cannot be found: record it with "
                         "with_stack=True (SGLang: POST /start_profile with \"with_stack\": true).")
    candidates = [marker] if marker else list(tt.DEFAULT_MARKERS)
    for pattern in candidates:
        rx = re.compile(pattern)
        found = [c for c in calls if rx.search(c.name)]
        if found:
            return pattern, _outermost(found)
    near = sorted({c.name for c in calls if re.search(r"forward|run_batch|step", c.name)})[:8]
    raise TraceError(f"no Python call in the trace matches the step marker {' or '.join(map(repr, candidates))}. "
                     f"Pass --marker REGEX (marker=...) naming a function called once per step; calls that look "
                     f"like one: {near or 'none'}.")


def step_windows(events: Sequence[Mapping[str, Any]], marker: str | None = None,
                 ops: Sequence[GpuOp] | None = None, calls: Sequence[PyCall] | None = None) -> Steps:
    """The step windows of a trace (see the module docstring for the rules); ``ops`` and ``calls``, when
    given, are the trace's :func:`gpu_ops` and :func:`python_calls` (saves reading them again)."""
    calls = python_calls(events) if calls is None else calls
    pattern, markers = _find_markers(calls, marker)
    by_key = {c.key: c for c in calls}
    on_stack: set[tuple[Any, Any, Any]] = set()
    starts_rx = re.compile(tt.PROFILER_START_PATTERN)
    profiler_starts = [c for c in calls if starts_rx.search(c.name)]
    if profiler_starts:
        parent = profiler_starts[0].parent_key
        while parent is not None and parent in by_key and parent not in on_stack:
            on_stack.add(parent)
            parent = by_key[parent].parent_key
    first_py_us = calls[0].start_us
    ops = gpu_ops(events) if ops is None else ops
    windows = []
    for i, m in enumerate(markers):
        note, partial = "", False
        if i + 1 < len(markers):
            end = markers[i + 1].start_us
        else:
            launched = [o.end_us for o in ops if m.start_us <= o.launch_us <= m.end_us]
            end = max([m.end_us, *launched])
            partial, note = True, ("last step: ends at its marker's end or its last GPU op; the scheduler's "
                                   "work after it is not in the window")
        if i == 0 and (m.key in on_stack or (not profiler_starts and m.start_us - first_py_us < ON_STACK_TOLERANCE_US)):
            first = "first step: its marker was already running when the profiler started"
            partial, note = True, f"{first}; {note}" if note else first
        windows.append(StepWindow(i, m.start_us, end, (m.end_us - m.start_us) / 1e3, partial, note))
    return Steps(pattern, markers[0].name, tuple(windows))


def _step_of(windows: Sequence[StepWindow], starts: Sequence[float], t: float) -> int | None:
    """The index of the window holding time ``t`` (windows sorted, start inclusive, end exclusive)."""
    i = bisect.bisect_right(starts, t) - 1
    return i if i >= 0 and t < windows[i].end_us else None


def phase_calls(calls: Sequence[PyCall], cpu_phases: Sequence[tuple[str, str]] = tt.CPU_PHASES) -> dict[str, list[PyCall]]:
    """The calls of each CPU phase (``(name, regex)`` pairs, searched in the call's name), in the order of
    ``calls``; every phase has a key, [] when none of its calls is in the trace."""
    names = {c.name for c in calls}  # a trace repeats few names many times: match each name once
    out = {}
    for phase, pattern in cpu_phases:
        rx = re.compile(pattern)
        hits = {n for n in names if rx.search(n)}
        out[phase] = [c for c in calls if c.name in hits]
    return out


def class_names(kernel_classes: Sequence[tuple[str, str]] = tt.KERNEL_CLASSES) -> list[str]:
    """Every GPU op class in table order: the name table's, memcpy and memset, then 'other'."""
    return [c for c, _ in kernel_classes] + sorted(set(tt.CATEGORY_CLASSES.values())) + [tt.OTHER_CLASS]


def step_breakdown(events: Sequence[Mapping[str, Any]], marker: str | None = None,
                   kernel_classes: Sequence[tuple[str, str]] = tt.KERNEL_CLASSES,
                   cpu_phases: Sequence[tuple[str, str]] = tt.CPU_PHASES,
                   verify_pattern: str = tt.VERIFY_STEP_PATTERN, ops: Sequence[GpuOp] | None = None,
                   calls: Sequence[PyCall] | None = None) -> list[dict[str, Any]]:
    """One row per step: wall, GPU busy/idle, GPU ms per kernel class, CPU ms per phase, graph launches.
    ``ops`` and ``calls``, when given, are the trace's :func:`gpu_ops` (classed with ``kernel_classes``) and
    :func:`python_calls` (saves reading them again)."""
    ops = gpu_ops(events, kernel_classes) if ops is None else ops
    calls = python_calls(events) if calls is None else calls
    steps = step_windows(events, marker, ops, calls)
    windows = steps.windows
    starts = [w.start_us for w in windows]
    ops_of: list[list[GpuOp]] = [[] for _ in windows]
    for o in ops:
        i = _step_of(windows, starts, o.launch_us)
        if i is not None:
            ops_of[i].append(o)
    graph_rx = re.compile(tt.GRAPH_LAUNCH_PATTERN)
    graph_launch_us = sorted(float(e["ts"]) for e in _complete(events, LAUNCH_CATEGORIES)
                             if graph_rx.search(str(e.get("name", ""))))
    by_phase = phase_calls(calls, cpu_phases)
    verify_starts = [c.start_us for c in phase_calls(calls, [("verify", verify_pattern)])["verify"]]  # sorted
    classes = class_names(kernel_classes)
    rows = []
    for w, step_ops in zip(windows, ops_of):
        wall_us = w.end_us - w.start_us
        busy_us = union_us((o.start_us, o.end_us) for o in step_ops)
        in_window_us = union_us((max(o.start_us, w.start_us), min(o.end_us, w.end_us)) for o in ops)
        split = shared_by_label_us((o.start_us, o.end_us, o.kernel_class) for o in step_ops)
        row: dict[str, Any] = {
            "step": w.step, "partial": w.partial, "note": w.note,
            "verify_step": (bisect.bisect_left(verify_starts, w.end_us)
                            > bisect.bisect_left(verify_starts, w.start_us)),
            "start_ms": (w.start_us - windows[0].start_us) / 1e3,
            "wall_ms": wall_us / 1e3, "gpu_busy_ms": busy_us / 1e3, "gpu_idle_ms": (wall_us - busy_us) / 1e3,
            "gpu_idle_in_window_ms": (wall_us - in_window_us) / 1e3, "marker_ms": w.marker_ms,
            "gpu_ops": len(step_ops),
            "graph_launches": (bisect.bisect_left(graph_launch_us, w.end_us)
                               - bisect.bisect_left(graph_launch_us, w.start_us)),
        }
        row.update({f"gpu_{c}_ms": split.get(c, 0.0) / 1e3 for c in classes})
        for name, _ in cpu_phases:
            row[f"cpu_{name}_ms"] = union_us((c.start_us, c.end_us) for c in by_phase[name]
                                             if w.start_us <= c.start_us < w.end_us) / 1e3
        rows.append(row)
    for r in rows:
        r["marker"] = steps.marker
        r["marker_name"] = steps.marker_name
    return rows


# --- summaries ---------------------------------------------------------------------------------------------
def summarize(rows: Sequence[Mapping[str, Any]], include_partial: bool = False,
              verify_only: bool = False) -> dict[str, Any]:
    """Medians per numeric column over the steps counted: partial steps left out unless ``include_partial``,
    steps that verified no drafts (``verify_step`` false: a prefill) left out when ``verify_only``."""
    def why_not(r: Mapping[str, Any]) -> str:
        if r.get("partial") and not include_partial:
            return str(r.get("note"))
        return "not a verify step" if verify_only and not r.get("verify_step") else ""

    used = [r for r in rows if not why_not(r)]
    excluded = [f"step {r.get('step')}: {why_not(r)}" for r in rows if why_not(r)]
    cols = [k for k, v in (used[0].items() if used else ())
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "start_ms")]
    return {
        "marker": rows[0].get("marker") if rows else None,
        "marker_name": rows[0].get("marker_name") if rows else None,
        "steps_found": len(rows), "steps": len(used), "steps_excluded": excluded,
        "verify_steps": sum(1 for r in used if r.get("verify_step")),
        "median": {c: quantile([float(r[c]) for r in used], 0.5) for c in cols},
        "cpu_phases_seen": sorted({k for r in rows for k, v in r.items() if k.startswith("cpu_") and v}),
    }


def top_kernels(events: Sequence[Mapping[str, Any]], marker: str | None = None, n: int = 15,
                kernel_classes: Sequence[tuple[str, str]] = tt.KERNEL_CLASSES) -> list[dict[str, Any]]:
    """The ``n`` GPU ops with the most time per complete step (plain durations, by name), with their class."""
    ops = gpu_ops(events, kernel_classes)
    keep = [w for w in step_windows(events, marker, ops).windows if not w.partial]
    if not keep:
        return []
    acc: dict[tuple[str, str], list[float]] = {}
    for o in ops:
        if any(w.start_us <= o.launch_us < w.end_us for w in keep):
            a = acc.setdefault((o.name, o.kernel_class), [0.0, 0])
            a[0] += o.end_us - o.start_us
            a[1] += 1
    top = sorted(acc.items(), key=lambda kv: -kv[1][0])[:n]
    return [{"name": name, "kernel_class": cls, "ms_per_step": total_us / 1e3 / len(keep),
             "calls_per_step": calls / len(keep)} for (name, cls), (total_us, calls) in top]


def format_summary(summary: Mapping[str, Any], top: Sequence[Mapping[str, Any]] = ()) -> str:
    """A readable table: median ms per step per column."""
    med = summary["median"]
    lines = [f"marker: {summary['marker']!r} (matched {summary['marker_name']!r})",
             f"steps found: {summary['steps_found']}; counted: {summary['steps']} ({summary['verify_steps']} verify "
             "steps); excluded: "
             + (("; ".join(summary["steps_excluded"])) or "none")]
    if not summary["steps"]:
        return "\n".join(lines + ["no complete step to summarize"])
    lines.append("median per step (ms):")
    for key, label in (("wall_ms", "wall"), ("gpu_busy_ms", "GPU busy (launched in step)"),
                       ("gpu_idle_ms", "GPU idle = wall - busy"), ("gpu_idle_in_window_ms", "GPU idle in window"),
                       ("marker_ms", "marker call (CPU)")):
        lines.append(f"  {label:<34}{med[key]:10.3f}")
    lines.append(f"  {'GPU ops launched':<34}{med['gpu_ops']:10.1f}   CUDA graph launches: {med['graph_launches']:.1f}")
    lines.append("GPU ms per kernel class (per step they add up to GPU busy; their medians need not):")
    by_class = [f"  {k[4:-3]:<34}{v:10.3f}" for k, v in med.items() if k.startswith("gpu_") and k.endswith("_ms")
                and k not in ("gpu_busy_ms", "gpu_idle_ms", "gpu_idle_in_window_ms") and v]
    lines += by_class or ["  none: no GPU op was launched in the counted steps (a CPU-only trace?)"]
    lines.append("CPU ms per phase (outermost call; phases nest, so they do not add up):")
    seen = set(summary["cpu_phases_seen"])
    lines += [f"  {k[4:-3]:<34}" + (f"{v:10.3f}" if k in seen else "   not in trace")
              for k, v in med.items() if k.startswith("cpu_")]
    if top:
        lines.append("top GPU ops (ms per counted step, plain durations):")
        lines += [f"  {t['ms_per_step']:9.3f} ms {t['calls_per_step']:7.1f}x  {t['kernel_class']:<26} {t['name'][:90]}"
                  for t in top]
    return "\n".join(lines)


# --- the run folder's step_profile table ----------------------------------------------------------------------
#: The run-folder table the rows go to (``step_profile.jsonl``); 08_compare_runs shows it.
STEP_PROFILE_TABLE = "step_profile"
#: What identifies one recorded trace in the table (recording it again appends nothing).
STEP_PROFILE_KEY = ("arm", "context_tokens", "trace_file")


def step_profile_rows(trace_path: str | Path, *, context_tokens: int, arm: str,
                      marker: str | None = None) -> list[dict[str, Any]]:
    """One trace's :func:`step_breakdown` rows with where they came from first: ``context_tokens`` (of the
    request being decoded), ``arm`` (the server set-up: "stock", "plugin", ...), ``trace_file`` (its name)."""
    path = Path(trace_path)
    rows = step_breakdown(load_trace(path), marker=marker)
    head = {"context_tokens": int(context_tokens), "arm": str(arm), "trace_file": path.name, "data_source": "measured"}
    return [{**head, **r} for r in rows]


def record_step_profile(run: Run, trace_path: str | Path, *, context_tokens: int, arm: str,
                        marker: str | None = None, table: str = STEP_PROFILE_TABLE) -> list[dict[str, Any]]:
    """Append one trace's rows to the run's ``step_profile`` table and return them. A trace already recorded
    (same arm, context and file name) is not appended twice: its rows in the table are returned."""
    key = (str(arm), int(context_tokens), Path(trace_path).name)
    if key in run.done_keys(table, STEP_PROFILE_KEY):
        return [r for r in run.rows(table) if tuple(r.get(f) for f in STEP_PROFILE_KEY) == key]
    rows = step_profile_rows(trace_path, context_tokens=context_tokens, arm=arm, marker=marker)
    for r in rows:
        run.append_row(table, r)
    return rows


# --- the command line ----------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdiag.telemetry.torch_trace", description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="torch chrome trace (.json or .json.gz), e.g. <profile_id>-TP-0.trace.json.gz")
    ap.add_argument("--marker", default=None, help="regex for the Python call that marks a step "
                    f"(default: the first of {list(tt.DEFAULT_MARKERS)} found)")
    ap.add_argument("--json", default=None, help="also write rows, summary and top kernels to this JSON file")
    ap.add_argument("--verify-only", action="store_true", help="count only steps that verified drafts")
    ap.add_argument("--top", type=int, default=15, help="how many GPU ops to list by time (0: none)")
    ap.add_argument("--run", default=None, help="also append the rows to this run folder's step_profile table "
                    "(needs --context-tokens and --arm)")
    ap.add_argument("--context-tokens", type=int, default=None, help="context of the profiled request (tokens)")
    ap.add_argument("--arm", default=None, help="which server set-up the trace is of, e.g. stock or plugin")
    args = ap.parse_args(argv)
    if args.run and (args.context_tokens is None or not args.arm):
        ap.error("--run needs --context-tokens and --arm")
    try:
        events = load_trace(args.trace)
        rows = step_breakdown(events, marker=args.marker)
    except (TraceError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = summarize(rows, verify_only=args.verify_only)
    top = top_kernels(events, marker=summary["marker"], n=args.top) if args.top else []
    print(f"trace: {args.trace}")
    print(format_summary(summary, top))
    if args.json:
        Path(args.json).write_text(json.dumps({"trace": str(args.trace), "summary": summary, "rows": rows,
                                               "top_kernels": top}, indent=1) + "\n")
        print(f"rows and summary written to {args.json}")
    if args.run:
        run = Run.create(Path(args.run).resolve())  # relative to the working folder, as a CLI path is
        recorded = record_step_profile(run, args.trace, context_tokens=args.context_tokens, arm=args.arm,
                                       marker=args.marker)
        print(f"{len(recorded)} rows in {run.table_path(STEP_PROFILE_TABLE)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
