"""Per-layer verify time from two arms of one server (stock and a fixed attention), projected to a deeper model.

Two runs of the same server and model that differ only in the verify-attention kernel (stock Triton
verify and the specdiag split-KV plugin, or SGLang's upstream split-KV) give two projections.

**Step-based** (:func:`project_layers`), from the whole verify step of each arm (ms per verify step, measured):

- saved per layer      = (stock(c) - fixed(c)) / layers_measured: what the kernel swap saves in one layer;
- growth per layer     = (arm(c) - arm(c0)) / layers_measured, c0 the shortest measured context: how much one
  layer's step time grows with context in that arm. It bounds the attention's context-dependent time from
  above: everything else that grows with context (drafting over a longer prefix, the scheduler) counts too,
  and is multiplied by the layers below as if it were attention.

The projection to a model of ``layers_target`` layers multiplies these per-layer numbers (computed):
at a measured context directly, and at ``target_context`` by a least-squares line of growth per layer against
context, extrapolated when the target lies past the longest measured context (then said so in ``extrapolated``).

**Traced** (:func:`project_traced`), from the verify-attention kernels' own GPU time in torch profiler traces (the
run folders' ``step_profile`` rows of :mod:`specdiag.telemetry.torch_trace`): per profiled context the median over
complete verify steps of the attention columns' sum (:data:`ATTENTION_COLUMNS`, measured), divided by the layers
measured (computed); against context, with two or more profiled contexts a least-squares line (intercept = fixed
cost per layer, slope = ms per 1k tokens per layer), with one context proportional scaling (no fixed cost: an upper
bound past that context, see :data:`PROPORTIONAL_NOTE`); at ``target_context`` x ``layers_target``. GPU work that
grows with context but runs once per step (SGLang's KV-index kernel, :data:`PER_STEP_COLUMNS`) is fitted the same
way and reported once per step, not multiplied by layers. :func:`compare_methods` sets each arm's growth by both
methods side by side: the difference is what else grew per step.

Both hold only for the same attention geometry per GPU (MLA latent 512 + 64, the same heads per rank, the same
draft tokens per step, batch 1) and say nothing of the rest of a deeper model's step (its MoE, its weights).
Pure functions: no I/O here (the command line reads the run folders).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from specdiag.hardware import lookup_gpu
from specdiag.runs import Run
from specdiag.stats import fit_line
from specdiag.telemetry.torch_trace import summarize
from specdiag.telemetry.trace_tables import KERNEL_CLASSES


@dataclass(frozen=True)
class LayerRow:
    context_tokens: int
    stock_step_ms: float          # measured, whole verify step of the stock arm
    fixed_step_ms: float          # measured, whole verify step of the arm with the faster attention
    saved_per_layer_ms: float     # computed: (stock - fixed) / layers_measured
    stock_growth_per_layer_ms: float  # computed: (stock(c) - stock(c0)) / layers_measured
    fixed_growth_per_layer_ms: float  # computed: (fixed(c) - fixed(c0)) / layers_measured
    projected_saved_ms: float     # computed: saved_per_layer_ms x layers_target
    projected_stock_growth_ms: float  # computed: stock growth per layer x layers_target
    projected_fixed_growth_ms: float  # computed: fixed growth per layer x layers_target


@dataclass(frozen=True)
class Projection:
    layers_measured: int
    layers_target: int
    target_context: int
    base_context: int                       # c0: the shortest measured context, growth is counted from it
    rows: list[LayerRow]
    stock_slope_ms_per_1k_per_layer: float  # least squares of stock growth per layer against context
    fixed_slope_ms_per_1k_per_layer: float
    target_stock_growth_ms: float           # layers_target x stock slope x (target_context - c0) / 1000
    target_fixed_growth_ms: float
    target_saved_ms: float                  # the difference of the two above
    extrapolated: bool                      # target_context past the longest measured context

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _slope_per_1k(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Ordinary least-squares slope of ys against xs, per 1,000 of x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("need at least two different contexts to fit a slope")
    return 1000.0 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def project_layers(stock_ms: Mapping[int, float], fixed_ms: Mapping[int, float], *, layers_measured: int,
                   layers_target: int = 61, target_context: int = 185_000) -> Projection:
    """Per-layer saved time and growth from two arms' ms per verify step at common contexts, scaled to
    ``layers_target`` layers (see the module docstring for the formulas and what they assume)."""
    if layers_measured < 1 or layers_target < 1:
        raise ValueError(f"layer counts must be >= 1; got measured {layers_measured}, target {layers_target}")
    common = sorted(set(stock_ms) & set(fixed_ms))
    if len(common) < 2:
        raise ValueError(f"need at least two contexts measured in both arms; common: {common}")
    c0 = common[0]
    rows = []
    for c in common:
        s, f = float(stock_ms[c]), float(fixed_ms[c])
        saved = (s - f) / layers_measured
        gs = (s - float(stock_ms[c0])) / layers_measured
        gf = (f - float(fixed_ms[c0])) / layers_measured
        rows.append(LayerRow(c, s, f, saved, gs, gf, saved * layers_target, gs * layers_target, gf * layers_target))
    xs = [float(r.context_tokens) for r in rows]
    k_s = _slope_per_1k(xs, [r.stock_growth_per_layer_ms for r in rows])
    k_f = _slope_per_1k(xs, [r.fixed_growth_per_layer_ms for r in rows])
    span_k = (target_context - c0) / 1000.0
    t_s, t_f = layers_target * k_s * span_k, layers_target * k_f * span_k
    return Projection(layers_measured, layers_target, target_context, c0, rows, k_s, k_f, t_s, t_f, t_s - t_f,
                      target_context > common[-1])


def step_ms_by_context(rows: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """Median ``step_ms`` per ``context_tokens`` of sweep rows (rows without a step are left out)."""
    by: dict[int, list[float]] = {}
    for r in rows:
        if r.get("step_ms") is not None and r.get("context_tokens") is not None and not r.get("error"):
            by.setdefault(int(r["context_tokens"]), []).append(float(r["step_ms"]))
    out = {}
    for c, v in by.items():
        v = sorted(v)
        m = len(v) // 2
        out[c] = v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2
    return out


# ---------------------------------------------------------------------------------------------------------------------
# One arm's whole step taken to the investigation's depth, context and GPU
# ---------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DepthProjection:
    """One arm's measured whole verify step (ms per step against context) taken to ``layers_target`` layers at
    ``target_context`` tokens, then to the investigation's GPU, and set against the step the investigation measured.

    - **measured at depth** (``layers_measured == layers_target``): the least-squares line of the measured steps over
      context, read at the target (interpolated or extrapolated along it); nothing is scaled by layers.
    - **scaled** (fewer layers measured): the same line x ``layers_target / layers_measured``: the whole step,
      its per-step host work and scheduler included, multiplied as if every part of it ran once per layer, which
      overstates the fixed part (a 2-layer SGLang step is mostly scheduler).
    - **hardware**: the line is the GPU the run measured. On the investigation's GPU the same kernel takes between
      the same time (a kernel whose time is set by the latency of its few thread blocks' dependent loads, as SGLang's
      Triton verify with 8 programs walking the whole prefix is) and that time x measured peak bandwidth / the
      investigation's (a kernel set by bandwidth): ``range_ms``.
    """

    run: str
    arm: str
    layers_measured: int
    layers_target: int
    method: str                       # "measured at depth" or "scaled from N layers"
    contexts: list[int]
    step_ms: list[float]              # measured, per context
    fit: ContextFit                   # line of the measured steps (ms per step at context), per measured model
    target_context: int
    target_source: str                # interpolated or extrapolated
    projected_ms: float               # computed: fit.at(target) x layers_target / layers_measured, on the run's GPU
    measured_peak_gb_s: float | None
    investigation_peak_gb_s: float | None
    range_ms: tuple[float, float] | None  # on the investigation's GPU: (latency-bound, bandwidth-bound)
    published_ms: float | None        # the investigation's measured step at target_context (published)
    published_over_projected: tuple[float, float] | None  # published / each end of range_ms (or of projected_ms)
    within: bool | None               # published inside range_ms

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def scale(self) -> float:
        return self.layers_target / self.layers_measured


def project_to_investigation(step_ms: Mapping[int, float], *, layers_measured: int, layers_target: int = 61,
                             target_context: int = 185_000, published_ms: float | None = None,
                             measured_peak_gb_s: float | None = None, investigation_peak_gb_s: float | None = None,
                             run: str = "", arm: str = "") -> DepthProjection:
    """One arm's ms per verify step at two or more contexts, taken to the investigation (see
    :class:`DepthProjection` for the method and what each end of the range assumes)."""
    if layers_measured < 1 or layers_target < 1:
        raise ValueError(f"layer counts must be >= 1; got measured {layers_measured}, target {layers_target}")
    points = sorted((int(c), float(v)) for c, v in step_ms.items() if v is not None)
    if len(points) < 2:
        raise ValueError(f"{run or 'the run'}{f' ({arm})' if arm else ''} has {len(points)} context(s) with a step "
                         "time: a line needs two or more")
    fit = fit_context(points)
    scale = layers_target / layers_measured
    projected = fit.at(target_context) * scale
    method = ("measured at depth" if layers_measured == layers_target
              else f"scaled from {layers_measured} layer{'s' if layers_measured > 1 else ''} (x{scale:.3g})")
    ratio = (measured_peak_gb_s / investigation_peak_gb_s
             if measured_peak_gb_s and investigation_peak_gb_s else None)
    rng = (projected, projected * ratio) if ratio else None
    if rng and rng[0] > rng[1]:
        rng = (rng[1], rng[0])
    over = within = None
    if published_ms:
        lo, hi = rng or (projected, projected)
        over = (published_ms / lo, published_ms / hi)
        within = lo <= published_ms <= hi if rng else None
    return DepthProjection(run, arm, layers_measured, layers_target, method, [c for c, _ in points],
                           [v for _, v in points], fit, target_context,
                           _target_source([c for c, _ in points], target_context), projected, measured_peak_gb_s,
                           investigation_peak_gb_s, rng, published_ms, over, within)


def recorded_peak_gb_s(meta: Mapping[str, Any], gpu_name: str = "") -> tuple[float, str] | None:
    """A run's peak memory bandwidth (GB/s) and where it came from: its run.json ``hardware``, else its ``device``
    GPU (or ``gpu_name``) in the table of known GPUs; None when nothing names it."""
    hw = dict(meta.get("hardware") or {})
    if hw.get("memory_bandwidth_gb_s"):
        return float(hw["memory_bandwidth_gb_s"]), f"recorded ({hw.get('device_name') or hw.get('gpu') or 'run.json'})"
    name = str((meta.get("device") or {}).get("gpu") or gpu_name or "")
    spec = lookup_gpu(name) if name else None
    return (spec.memory_bandwidth_gb_s, f"published ({spec.name}, table of known GPUs)") if spec else None


def arm_steps(meta: Mapping[str, Any], engine_ab_rows: Sequence[Mapping[str, Any]],
              sweep_rows: Sequence[Mapping[str, Any]], arm: str) -> dict[int, float]:
    """An arm's median ms per verify step per context from a run folder's rows: an engine A/B run's decode rows of
    ``arm`` (``phase`` "decode", docs/run-folder.md; the median 09's decode table shows), else its sweep rows (one
    server, one arm). Rows with an error or without a step time are left out."""
    if engine_ab_rows:
        return step_ms_by_context([r for r in engine_ab_rows if r.get("arm") == arm and r.get("phase") == "decode"])
    return step_ms_by_context(sweep_rows)


# ---------------------------------------------------------------------------------------------------------------------
# The traced projection: from the verify-attention kernels' own GPU time (step_profile rows), not the whole step
# ---------------------------------------------------------------------------------------------------------------------
#: step_profile columns that are the verify attention, which runs once per layer: every ``attn_*`` class of
#: :data:`~specdiag.telemetry.trace_tables.KERNEL_CLASSES` (stock Triton, specdiag split-KV, SGLang's upstream split-KV,
#: FlashInfer/FlashMLA). A step's attention time is their sum.
ATTENTION_COLUMNS: tuple[str, ...] = tuple(f"gpu_{c}_ms" for c, _ in KERNEL_CLASSES if c.startswith("attn_"))
#: step_profile columns of GPU work that grows with context but runs once per step, whatever the layer count:
#: SGLang's ``create_flashinfer_kv_indices_triton`` (the triton backend's ``init_forward_metadata``, one call per
#: forward; the s3 traces show 1.0 call per step against 2.0 of the attention kernel in the 2-layer model).
PER_STEP_COLUMNS: tuple[str, ...] = ("gpu_kv_indices_ms",)

PROPORTIONAL_NOTE = (
    "proportional: one profiled context c1, so ms(c) = ms(c1) x c / c1, with no fixed cost. If the kernel's time is a "
    "fixed part a plus a part b x c (a, b >= 0), this is an upper bound for every c >= c1: it grows the fixed part "
    "too, overstating by a x (c / c1 - 1), the more the shorter c1 is (a short context's time is mostly fixed cost); "
    "for c < c1 it is a lower bound. ms(c1) / layer bounds the fixed cost per layer from above.")
LINE_NOTE = ("least-squares line over {n} profiled contexts: intercept = fixed cost, slope = ms per 1k tokens "
             "(both computed from the measured points: no assumption about the fixed cost); interpolated between "
             "them, extrapolated past them along the line.")


class MissingTraces(ValueError):
    """A run has no step_profile rows (no torch profiler trace was recorded and computed for it)."""


@dataclass(frozen=True)
class TracedContext:
    context_tokens: int
    steps: int                     # complete verify steps of the trace(s) the medians are over
    attention_ms_per_step: float   # measured (trace): median over the steps of the attention columns' sum, all layers
    attention_ms_per_layer: float  # computed: attention_ms_per_step / layers_measured
    per_step_ms: float             # measured (trace): median of the per-step columns' sum (KV-index kernel), per step


@dataclass(frozen=True)
class ContextFit:
    """ms against context: ``fixed_ms + ms_per_1k_tokens x context / 1000``."""

    method: str              # "line" (least squares, >= 2 contexts) or "proportional" (one context, fixed_ms = 0)
    fixed_ms: float          # line: the intercept (computed); proportional: 0 (assumed)
    ms_per_1k_tokens: float  # line: the slope (computed); proportional: ms(c1) / c1 x 1000

    def at(self, context_tokens: float) -> float:
        return self.fixed_ms + self.ms_per_1k_tokens * context_tokens / 1000.0


@dataclass(frozen=True)
class TracedArm:
    name: str                             # "stock" or "fixed"
    run: str                              # the run folder's name (empty when not given)
    contexts: list[TracedContext]         # measured (trace) and per layer (computed), per profiled context
    method: str                           # "line" or "proportional"
    method_note: str                      # what the method assumes and which way it errs
    attention_fit_per_layer: ContextFit   # computed: attention ms per layer against context
    per_step_fit: ContextFit              # computed: the per-step columns' ms against context (not per layer)
    target_attention_ms_per_layer: float  # attention_fit_per_layer at target_context
    target_attention_ms: float            # x layers_target: the verify attention's ms per step of the deeper model
    target_per_step_ms: float             # per_step_fit at target_context: once per step, NOT x layers
    target_source: str                    # "extrapolated", "interpolated" or "at a profiled context"


@dataclass(frozen=True)
class TracedProjection:
    layers_measured: int
    layers_target: int
    target_context: int
    stock: TracedArm
    fixed: TracedArm
    target_saved_ms: float    # computed: stock.target_attention_ms - fixed.target_attention_ms
    sources: dict[str, str]   # field -> measured (trace) / computed / extrapolated or interpolated

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sum_columns(row: Mapping[str, Any], columns: Sequence[str]) -> float:
    return sum(float(row.get(c) or 0.0) for c in columns)


def traced_contexts(rows: Sequence[Mapping[str, Any]], *, layers_measured: int, run: str = "",
                    arm: str | None = None) -> list[TracedContext]:
    """Per profiled context of one run's step_profile rows: the median verify-attention GPU ms per step (the
    sum of :data:`ATTENTION_COLUMNS` per step, then the median over complete verify steps, as
    :func:`~specdiag.telemetry.torch_trace.summarize` counts them) and the same of :data:`PER_STEP_COLUMNS`."""
    if layers_measured < 1:
        raise ValueError(f"layers_measured must be >= 1; got {layers_measured}")
    where = f"{run}: " if run else ""
    if not rows:
        raise MissingTraces(f"{where}no step_profile rows (step_profile.jsonl): record a trace and compute them with "
                            "`python -m specdiag.telemetry.torch_trace TRACE --run RUN_DIR --context-tokens N --arm NAME`")
    arms = sorted({str(r.get("arm")) for r in rows})
    if arm is None and len(arms) > 1:
        raise ValueError(f"{where}step_profile rows of several arms {arms}: say which one (arm=...)")
    picked = [r for r in rows if arm is None or str(r.get("arm")) == arm]
    if not picked:
        raise MissingTraces(f"{where}no step_profile rows of arm {arm!r}; arms there: {arms}")
    if not any(c in r for r in picked for c in ATTENTION_COLUMNS):
        raise ValueError(f"{where}the step_profile rows have none of the attention columns {list(ATTENTION_COLUMNS)}: "
                         "compute them again with the current specdiag.telemetry.torch_trace")
    by_ctx: dict[int, list[dict[str, Any]]] = {}
    for r in picked:
        by_ctx.setdefault(int(r["context_tokens"]), []).append(
            {**r, "verify_attention_ms": _sum_columns(r, ATTENTION_COLUMNS),
             "per_step_context_ms": _sum_columns(r, PER_STEP_COLUMNS)})
    out = []
    for c in sorted(by_ctx):
        s = summarize(by_ctx[c], verify_only=True)
        if not s["steps"]:
            raise ValueError(f"{where}no complete verify step in the {c:,}-token trace "
                             f"({len(by_ctx[c])} steps, excluded: {s['steps_excluded']}): profile more steps")
        att = float(s["median"]["verify_attention_ms"])
        if att <= 0:
            raise ValueError(f"{where}no verify-attention kernel time in the {c:,}-token trace: its attention kernels "
                             "matched no attn_ class of specdiag.telemetry.trace_tables.KERNEL_CLASSES (see "
                             "`python -m specdiag.telemetry.torch_trace TRACE`'s top GPU ops and add their names)")
        out.append(TracedContext(c, int(s["steps"]), att, att / layers_measured,
                                 float(s["median"]["per_step_context_ms"])))
    return out


def fit_context(points: Sequence[tuple[float, float]]) -> ContextFit:
    """A line of ms against context over two or more distinct contexts (least squares, :func:`specdiag.stats.fit_line`),
    else proportional scaling from the one context (``fixed_ms`` 0: see :data:`PROPORTIONAL_NOTE`)."""
    if not points:
        raise ValueError("no (context, ms) point to fit")
    if len({c for c, _ in points}) >= 2:
        f = fit_line([c for c, _ in points], [ms for _, ms in points])
        return ContextFit("line", f.intercept, f.slope_per_1k)
    c1 = points[0][0]
    if c1 <= 0:
        raise ValueError(f"proportional scaling needs a context > 0; got {c1}")
    ms1 = sum(ms for _, ms in points) / len(points)
    return ContextFit("proportional", 0.0, 1000.0 * ms1 / c1)


def _target_source(contexts: Sequence[int], target_context: int) -> str:
    if target_context in contexts and len(set(contexts)) == 1:
        return "at a profiled context"
    return "interpolated" if min(contexts) <= target_context <= max(contexts) else "extrapolated"


def traced_arm(name: str, contexts: Sequence[TracedContext], *, layers_target: int, target_context: int,
               run: str = "") -> TracedArm:
    """One arm's traced contexts fitted (line or proportional) and taken to ``target_context``: the attention per
    layer x ``layers_target``, the per-step part once."""
    if not contexts:
        raise MissingTraces(f"{run or name}: no profiled context")
    att = fit_context([(t.context_tokens, t.attention_ms_per_layer) for t in contexts])
    per_step = fit_context([(t.context_tokens, t.per_step_ms) for t in contexts])
    note = LINE_NOTE.format(n=len(contexts)) if att.method == "line" else PROPORTIONAL_NOTE
    per_layer = att.at(target_context)
    return TracedArm(name, run, list(contexts), att.method, note, att, per_step, per_layer, per_layer * layers_target,
                     per_step.at(target_context), _target_source([t.context_tokens for t in contexts], target_context))


def project_traced(stock_rows: Sequence[Mapping[str, Any]], fixed_rows: Sequence[Mapping[str, Any]], *,
                   layers_measured: int, layers_target: int = 61, target_context: int = 185_000,
                   stock_run: str = "", fixed_run: str = "") -> TracedProjection:
    """The verify attention of both arms, from their step_profile rows (traced kernel times), projected to
    ``layers_target`` layers at ``target_context``. Raises :class:`MissingTraces` naming the run without rows."""
    if layers_target < 1:
        raise ValueError(f"layers_target must be >= 1; got {layers_target}")
    kw = dict(layers_target=layers_target, target_context=target_context)
    stock = traced_arm("stock", traced_contexts(stock_rows, layers_measured=layers_measured, run=stock_run or "stock"),
                       run=stock_run, **kw)
    fixed = traced_arm("fixed", traced_contexts(fixed_rows, layers_measured=layers_measured, run=fixed_run or "fixed"),
                       run=fixed_run, **kw)
    sources = {
        "contexts[].attention_ms_per_step, contexts[].per_step_ms": "measured (trace): median over complete verify steps",
        "contexts[].attention_ms_per_layer": f"computed: / {layers_measured} layers measured",
        "attention_fit_per_layer, per_step_fit": "computed: least-squares line (>= 2 profiled contexts) or proportional (1)",
        "stock.target_*": f"{stock.target_source} ({stock.method}) to {target_context:,} tokens, x {layers_target} layers "
                          "for the attention, once for the per-step part",
        "fixed.target_*": f"{fixed.target_source} ({fixed.method}) to {target_context:,} tokens, x {layers_target} layers "
                          "for the attention, once for the per-step part",
        "target_saved_ms": "computed: stock minus fixed target attention",
    }
    return TracedProjection(layers_measured, layers_target, target_context, stock, fixed,
                            stock.target_attention_ms - fixed.target_attention_ms, sources)


@dataclass(frozen=True)
class MethodDifference:
    """One arm's growth with context at the target, by the two methods (both computed)."""

    arm: str                       # "stock" or "fixed"
    from_context: int              # growth counted from here (the step-based projection's base context)
    step_growth_ms: float          # step-based: whole-step growth per layer x layers_target
    traced_growth_ms: float        # traced: attention per layer at target minus at from_context, x layers_target
    other_growth_ms: float         # step minus traced: what else grew per step, multiplied by layers as if attention
    other_growth_per_step_ms: float  # the same back in the measured model: other_growth_ms x measured / target layers


def compare_methods(step: Projection, traced: TracedProjection) -> list[MethodDifference]:
    """Each arm's growth at the target by the step-based and the traced projection. Their difference is what
    else grew with context in that arm's step (drafting on the CPU, the KV-index kernel, the scheduler), which the
    step-based method multiplies by the layers."""
    if (step.layers_target, step.target_context) != (traced.layers_target, traced.target_context):
        raise ValueError("the two projections differ in target: step-based "
                         f"{step.layers_target} layers at {step.target_context:,}, traced {traced.layers_target} at "
                         f"{traced.target_context:,}")
    c0, t, n = step.base_context, traced.target_context, traced.layers_target
    out = []
    for arm, step_growth in ((traced.stock, step.target_stock_growth_ms), (traced.fixed, step.target_fixed_growth_ms)):
        traced_growth = n * (arm.attention_fit_per_layer.at(t) - arm.attention_fit_per_layer.at(c0))
        other = step_growth - traced_growth
        out.append(MethodDifference(arm.name, c0, step_growth, traced_growth, other,
                                    other * traced.layers_measured / n))
    return out


def traced_table_rows(tp: TracedProjection) -> list[dict[str, Any]]:
    """One row per arm and profiled context (measured), then one per arm at the target (computed or extrapolated)."""
    rows: list[dict[str, Any]] = []
    for arm in (tp.stock, tp.fixed):
        for c in arm.contexts:
            rows.append({"arm": arm.name, "context_tokens": c.context_tokens,
                         "source": f"measured (trace, {c.steps} steps)",
                         "attention_ms_per_step": c.attention_ms_per_step,
                         "attention_ms_per_layer": c.attention_ms_per_layer, "layers": tp.layers_measured,
                         "per_step_ms": c.per_step_ms})
    for arm in (tp.stock, tp.fixed):
        rows.append({"arm": arm.name, "context_tokens": tp.target_context,
                     "source": f"{arm.target_source} ({arm.method})",
                     "attention_ms_per_step": arm.target_attention_ms,
                     "attention_ms_per_layer": arm.target_attention_ms_per_layer, "layers": tp.layers_target,
                     "per_step_ms": arm.target_per_step_ms})
    return rows


def layers_of(meta: Mapping[str, Any], where: str = "run.json") -> int:
    """The measured model's layer count: run.json's ``model.model_config.num_hidden_layers``."""
    layers = int(((meta.get("model") or {}).get("model_config") or {}).get("num_hidden_layers") or 0)
    if layers < 1:
        raise ValueError(f"{where} has no model.model_config.num_hidden_layers: the measured layer count is needed")
    return layers


def format_traced(tp: TracedProjection, differences: Sequence[MethodDifference] = ()) -> str:
    """The traced projection as plain text lines (the command line's ``--traced`` output)."""
    lines = [f"traced verify attention (ms per step; {tp.layers_measured} layers measured, x {tp.layers_target} at "
             f"the target; per-step = {', '.join(PER_STEP_COLUMNS)}, once per step, not x layers)",
             "arm | context | source | attention/step | attention/layer | layers | per-step"]
    lines += [f"{r['arm']} | {r['context_tokens']:,} | {r['source']} | {r['attention_ms_per_step']:.3f} | "
              f"{r['attention_ms_per_layer']:.4f} | {r['layers']} | {r['per_step_ms']:.3f}"
              for r in traced_table_rows(tp)]
    for arm in (tp.stock, tp.fixed):
        f = arm.attention_fit_per_layer
        lines.append(f"{arm.name} ({arm.run or 'run'}): {arm.method}, fixed {f.fixed_ms:.4f} ms per layer + "
                     f"{f.ms_per_1k_tokens:.5f} ms per 1k tokens per layer; {arm.method_note}")
    lines.append(f"at {tp.target_context:,} tokens x {tp.layers_target} layers: stock attention "
                 f"{tp.stock.target_attention_ms:,.1f} ms, fixed {tp.fixed.target_attention_ms:,.2f} ms, saved "
                 f"{tp.target_saved_ms:,.1f} ms per verify step; per-step part (once): stock "
                 f"{tp.stock.target_per_step_ms:.3f} ms, fixed {tp.fixed.target_per_step_ms:.3f} ms")
    for d in differences:
        lines.append(f"{d.arm}: growth from {d.from_context:,} step-based {d.step_growth_ms:,.1f} ms, traced "
                     f"{d.traced_growth_ms:,.1f} ms: {d.other_growth_ms:,.1f} ms of it is not attention "
                     f"({d.other_growth_per_step_ms:.2f} ms per step of the {tp.layers_measured}-layer model at {tp.target_context:,} "
                     "tokens: growth outside the attention)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m specdiag.steps.bandwidth_analysis.verify_projection --stock RUN --fixed RUN [--traced]``: the table from two recorded runs."""
    p = argparse.ArgumentParser(prog="python -m specdiag.steps.bandwidth_analysis.verify_projection", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stock", required=True, help="run folder of the stock arm, e.g. data/reference/sglang-h200-mla2-stock-traced")
    p.add_argument("--fixed", required=True, help="run folder of the faster arm, e.g. data/reference/sglang-h200-mla2-plugin-traced")
    p.add_argument("--layers-target", type=int, default=61)
    p.add_argument("--target-context", type=int, default=185_000)
    p.add_argument("--traced", action="store_true", help="also project from the traced verify-attention kernel "
                   "times (both runs' step_profile.jsonl, from specdiag.telemetry.torch_trace) and set the two methods "
                   "side by side")
    a = p.parse_args(argv)
    stock, fixed = Run.open(a.stock), Run.open(a.fixed)
    try:
        layers = layers_of(stock.meta, f"{stock.path}/run.json")
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    pr = project_layers(step_ms_by_context(stock.rows("sweep")), step_ms_by_context(fixed.rows("sweep")),
                        layers_measured=layers, layers_target=a.layers_target, target_context=a.target_context)
    print(f"stock {stock.path.name} vs fixed {fixed.path.name}: {layers} layers measured, projected to {a.layers_target}"
          " (ms; step measured, the rest computed)")
    print("context | stock step | fixed step | saved/layer | stock growth/layer | fixed growth/layer | "
          f"saved x{a.layers_target} | stock growth x{a.layers_target} | fixed growth x{a.layers_target}")
    for r in pr.rows:
        print(f"{r.context_tokens:,} | {r.stock_step_ms:.2f} | {r.fixed_step_ms:.2f} | {r.saved_per_layer_ms:.2f} | "
              f"{r.stock_growth_per_layer_ms:.2f} | {r.fixed_growth_per_layer_ms:.2f} | {r.projected_saved_ms:.0f} | "
              f"{r.projected_stock_growth_ms:.0f} | {r.projected_fixed_growth_ms:.0f}")
    print(f"least squares per layer: stock {pr.stock_slope_ms_per_1k_per_layer:.4f}, fixed "
          f"{pr.fixed_slope_ms_per_1k_per_layer:.4f} ms per 1k tokens")
    print(f"at {pr.target_context:,} tokens x {pr.layers_target} layers (growth from {pr.base_context:,}"
          f"{', extrapolated' if pr.extrapolated else ''}): stock {pr.target_stock_growth_ms:.0f} ms, fixed "
          f"{pr.target_fixed_growth_ms:.0f} ms, saved {pr.target_saved_ms:.0f} ms per verify step")
    if a.traced:
        fixed_layers = layers_of(fixed.meta, f"{fixed.path}/run.json")
        if fixed_layers != layers:
            print(f"error: the arms differ in layers ({stock.path.name} {layers}, {fixed.path.name} {fixed_layers}): "
                  "a pair must be the same model", file=sys.stderr)
            return 2
        try:
            tp = project_traced(stock.rows("step_profile"), fixed.rows("step_profile"), layers_measured=layers,
                                layers_target=a.layers_target, target_context=a.target_context,
                                stock_run=stock.path.name, fixed_run=fixed.path.name)
        except ValueError as exc:  # MissingTraces included
            print(f"no traced projection: {exc}", file=sys.stderr)
            return 2
        print()
        print(format_traced(tp, compare_methods(pr, tp)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
