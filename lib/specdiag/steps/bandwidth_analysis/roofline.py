"""Roofline of one decode (verify) step: bytes and FLOPs, the floors they set, and how far a measured
step is from them. Pure functions; the inputs come from :mod:`specdiag.geometry` and
:mod:`specdiag.hardware`.

Formulas (per rank, one step at context L; 1 GB = 1e9 B):

- bytes = KV bytes (geometry.kv_bytes_per_step) + weight bytes (geometry.weight_bytes_per_step)
- memory floor = bytes / peak bandwidth; the KV-only floor = KV bytes / peak bandwidth
- verify attention FLOPs (T = draft tokens verified in the step, h = local query heads):
  - MLA, weights absorbed (FlashMLA's deep-dive: FLOPs = 2 h s_q s_k (d_k + d_v)):
    ``2 x h x T x span x (kv_lora_rank + qk_rope_head_dim + kv_lora_rank)`` per layer
    (576 + 512 = 1088 for DeepSeek-V3/Kimi-K2);
  - GQA/MHA: ``2 x h x T x span x (head_dim + head_dim)`` per layer (Q.K^T and P.V).
- compute floor = verify FLOPs / peak matmul rate (bf16 on a GPU; a CPU's faster of bf16 and fp32); the step's
  floor = max(memory, compute).
  MLA verify does about 2 h T FLOP per KV byte, so many heads x draft tokens make it compute-bound
  (``kernels.mla.verify_flops`` against ``kernels.mla.kv_bytes``).
- effective bandwidth = bytes / measured step time; efficiency = floor / measured (1 = at the floor);
  % of peak = effective bandwidth / peak bandwidth.
- slopes: least-squares ms per 1k tokens of the measured step time and of the memory floor over the
  same contexts; their ratio says how much more the step grows with context than the bytes do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from specdiag.findings import Finding, Source
from specdiag.geometry import (
    ExpertRouting,
    ModelGeometry,
    attention_span_tokens,
    kv_bytes_per_step,
    local_attention_heads,
    weight_bytes_per_step,
)
from specdiag.hardware import HardwarePeaks, gb_s
from specdiag.stats import LineFit, fit_line

#: A measured time below this share of its floor cannot be: a peak the floor came from is too low.
BELOW_FLOOR_X = 0.9


def below_floor_cause(bound: str, peaks: HardwarePeaks) -> str:
    """What to say of a time under its floor: which peak made the floor, where it came from, what to pass."""
    peak = peaks.matmul if bound == "compute" and peaks.matmul else peaks.memory_bandwidth
    name = "matmul_tflops" if bound == "compute" else "memory_bandwidth_gb_s"
    return (f"faster than the floor allows, so the {bound} peak it was computed from is too low ({peak.label}: "
            f"{peak.detail}); pass {name} with the device's real figure")


def verify_attention_flops(geom: ModelGeometry, context_tokens: int, draft_tokens: int, tp_size: int = 1) -> float:
    """Attention FLOPs one rank does to verify ``draft_tokens`` tokens against ``context_tokens`` of KV."""
    if draft_tokens < 1:
        raise ValueError(f"draft_tokens must be >= 1; got {draft_tokens}")
    heads = local_attention_heads(geom, tp_size)
    if geom.attention == "mla":
        assert geom.kv_lora_rank is not None and geom.qk_rope_head_dim is not None
        dims = geom.kv_lora_rank + geom.qk_rope_head_dim + geom.kv_lora_rank
    else:
        dims = 2 * geom.head_dim
    span_sum = sum(attention_span_tokens(geom, context_tokens, layer) for layer in range(geom.num_layers))
    return 2.0 * heads * draft_tokens * span_sum * dims


def memory_floor_s(n_bytes: float, bandwidth_bytes_per_s: float) -> float:
    """Seconds to move ``n_bytes`` at the peak bandwidth."""
    if bandwidth_bytes_per_s <= 0:
        raise ValueError("bandwidth must be positive")
    return n_bytes / bandwidth_bytes_per_s


def compute_floor_s(flops: float, flop_per_s: float) -> float:
    """Seconds to do ``flops`` at the peak rate."""
    if flop_per_s <= 0:
        raise ValueError("matmul rate must be positive")
    return flops / flop_per_s


def effective_bandwidth(n_bytes: float, measured_s: float) -> float:
    """Bytes per second the step achieved if it moved ``n_bytes`` in ``measured_s``."""
    if measured_s <= 0:
        raise ValueError("measured time must be positive")
    return n_bytes / measured_s


def efficiency(floor_s: float, measured_s: float) -> float:
    """Floor over measured: 1.0 at the floor, 0.01 when the step takes 100x the floor."""
    if measured_s <= 0:
        raise ValueError("measured time must be positive")
    return floor_s / measured_s


@dataclass(frozen=True)
class StepRoofline:
    """One context's step: its bytes, FLOPs and floors, and (when measured) how it compares."""

    context_tokens: int
    kv_bytes: float                 # KV one rank reads per step
    weight_bytes: float             # weights one rank reads per step
    verify_flops: float             # attention FLOPs one rank does per step
    peak_bandwidth_bytes_per_s: float
    peak_flop_per_s: float | None
    measured_step_s: float | None = None

    @property
    def total_bytes(self) -> float:
        return self.kv_bytes + self.weight_bytes

    @property
    def memory_floor_s(self) -> float:
        return memory_floor_s(self.total_bytes, self.peak_bandwidth_bytes_per_s)

    @property
    def kv_floor_s(self) -> float:
        return memory_floor_s(self.kv_bytes, self.peak_bandwidth_bytes_per_s)

    @property
    def compute_floor_s(self) -> float | None:
        return compute_floor_s(self.verify_flops, self.peak_flop_per_s) if self.peak_flop_per_s else None

    @property
    def floor_s(self) -> float:
        """max(memory floor, compute floor)."""
        return max(self.memory_floor_s, self.compute_floor_s or 0.0)

    def as_row(self) -> dict[str, Any]:
        """A table row in display units (GB, ms, GB/s, %)."""
        m = self.measured_step_s
        row: dict[str, Any] = {
            "context_tokens": self.context_tokens,
            "kv_gb_per_step": self.kv_bytes / 1e9,
            "weight_gb_per_step": self.weight_bytes / 1e9,
            "total_gb_per_step": self.total_bytes / 1e9,
            "kv_floor_ms": 1e3 * self.kv_floor_s,
            "memory_floor_ms": 1e3 * self.memory_floor_s,
            "verify_tflop_per_step": self.verify_flops / 1e12,
            "compute_floor_ms": 1e3 * self.compute_floor_s if self.compute_floor_s is not None else None,
            "floor_ms": 1e3 * self.floor_s,
            "measured_ms": 1e3 * m if m else None,
            "measured_over_floor_x": m / self.floor_s if m else None,
            "effective_gb_s_kv": effective_bandwidth(self.kv_bytes, m) / 1e9 if m else None,
            "effective_gb_s_total": effective_bandwidth(self.total_bytes, m) / 1e9 if m else None,
            "pct_of_peak_kv": 100 * effective_bandwidth(self.kv_bytes, m) / self.peak_bandwidth_bytes_per_s if m else None,
            "pct_of_peak_total": (100 * effective_bandwidth(self.total_bytes, m) / self.peak_bandwidth_bytes_per_s
                                  if m else None),
            "efficiency_pct": 100 * efficiency(self.floor_s, m) if m else None,
        }
        return row


def step_roofline(geom: ModelGeometry, context_tokens: int, peaks: HardwarePeaks, tp_size: int = 1,
                  draft_tokens: int = 1, measured_step_ms: float | None = None,
                  routing: ExpertRouting = "min") -> StepRoofline:
    """The roofline of one step at ``context_tokens`` on one rank (see the module docstring)."""
    weights = weight_bytes_per_step(geom, tp_size=tp_size, tokens_per_step=draft_tokens, routing=routing)
    return StepRoofline(
        context_tokens=int(context_tokens),
        kv_bytes=kv_bytes_per_step(geom, context_tokens, tp_size),
        weight_bytes=weights.total,
        verify_flops=verify_attention_flops(geom, context_tokens, draft_tokens, tp_size),
        peak_bandwidth_bytes_per_s=peaks.memory_bandwidth.value,
        peak_flop_per_s=peaks.matmul.value if peaks.matmul else None,
        measured_step_s=measured_step_ms / 1e3 if measured_step_ms else None,
    )


@dataclass(frozen=True)
class SlopeComparison:
    """Measured step time vs the memory floor, both as lines in context (ms per 1k tokens)."""

    measured: LineFit
    floor: LineFit

    @property
    def ratio(self) -> float:
        """Measured slope over the floor's slope (inf when the floor does not grow)."""
        return self.measured.slope / self.floor.slope if self.floor.slope > 0 else float("inf")


def slope_comparison(steps: Sequence[StepRoofline]) -> SlopeComparison:
    """Least-squares slopes of the measured step time and of the memory floor over measured contexts."""
    pts = [s for s in steps if s.measured_step_s]
    if len(pts) < 2:
        raise ValueError("a slope needs measured step times at two or more contexts")
    x = [s.context_tokens for s in pts]
    return SlopeComparison(measured=fit_line(x, [1e3 * s.measured_step_s for s in pts]),  # type: ignore[operator]
                           floor=fit_line(x, [1e3 * s.memory_floor_s for s in pts]))


def endpoint_slopes_ms_per_1k(steps: Sequence[StepRoofline]) -> tuple[float, float]:
    """(measured, memory floor) slopes between the shortest and the longest measured context, ms per 1k tokens."""
    pts = sorted((s for s in steps if s.measured_step_s), key=lambda s: s.context_tokens)
    if len(pts) < 2 or pts[-1].context_tokens == pts[0].context_tokens:
        raise ValueError("end-point slopes need measured step times at two distinct contexts")
    span_k = (pts[-1].context_tokens - pts[0].context_tokens) / 1000
    measured = 1e3 * (pts[-1].measured_step_s - pts[0].measured_step_s) / span_k  # type: ignore[operator]
    floor = 1e3 * (pts[-1].memory_floor_s - pts[0].memory_floor_s) / span_k
    return measured, floor


def implied_time_s(n_bytes: float, bandwidth_bytes_per_s: float) -> float:
    """How long moving ``n_bytes`` takes at a quoted bandwidth (to reconcile a quoted GB/s)."""
    return memory_floor_s(n_bytes, bandwidth_bytes_per_s)


# ---------------------------------------------------------------------------------------------
# Findings
# ---------------------------------------------------------------------------------------------

def _tok(n: int) -> str:
    return f"{n:,} tokens"


def _size(n_bytes: float) -> str:
    """13.0e9 -> '13.0 GB', 5.25e5 -> '0.525 MB' (decimal units)."""
    return f"{n_bytes / 1e9:#.3g} GB" if n_bytes >= 1e8 else f"{n_bytes / 1e6:#.3g} MB"


def bandwidth_findings(steps: Sequence[StepRoofline], peaks: HardwarePeaks, source: Source = "measured",
                       floor_ratio_threshold: float = 10.0, slope_ratio_threshold: float = 10.0,
                       quoted_attention_gb_s: float | None = None,
                       quoted_source: str = "parameter") -> list[Finding]:
    """Verdicts of the bandwidth analysis at the longest measured context (thresholds are parameters).

    - ``bandwidth.far_from_floor``: measured / floor >= ``floor_ratio_threshold`` is critical
      (something on the step, most likely the attention kernel, is far from the floor); >= 2x warning.
    - ``bandwidth.slope``: measured slope / floor slope >= ``slope_ratio_threshold`` is critical (the
      context-dependent work is under suspicion); >= 2x warning.
    - ``bandwidth.compute_bound``: whether the verify attention's compute floor exceeds the memory floor.
    - ``bandwidth.attention_only``: with a quoted attention-only bandwidth, the attention time it implies;
      ``quoted_source`` says where the quote came from (``parameter``: the user passed it; a recorded run's
      published quote: e.g. ``published (run.json)``).
    """
    found: list[Finding] = []
    measured = [s for s in steps if s.measured_step_s]
    if not measured:
        return found
    last = max(measured, key=lambda s: s.context_tokens)
    row = last.as_row()
    peak_gb_s = peaks.memory_bandwidth_gb_s
    ratio = row["measured_over_floor_x"]
    sev = "critical" if ratio >= floor_ratio_threshold else "warning" if ratio >= 2 or ratio < BELOW_FLOOR_X else "ok"
    cmp = slope_comparison(measured) if len({s.context_tokens for s in measured}) >= 2 else None
    if ratio < BELOW_FLOOR_X:
        bound = "compute" if (row["compute_floor_ms"] or 0) > row["memory_floor_ms"] else "memory"
        cause = ": " + below_floor_cause(bound, peaks) + "."
    elif sev == "ok":
        cause = "."
    elif cmp is None or cmp.ratio >= slope_ratio_threshold:
        cause = (". Something on the step, most likely the attention kernel, is far from the memory floor"
                 + (" (the excess grows with context)." if cmp is not None else "."))
    else:
        cause = (". The excess hardly grows with context, so a per-step cost that does not depend on it (framework "
                 "or launch overhead, host-side work, weights read below the peak) dominates rather than the "
                 "attention over the KV.")
    found.append(Finding(
        "bandwidth.far_from_floor", "Measured step vs the memory floor",
        f"At {_tok(last.context_tokens)} a step reads {_size(last.total_bytes)} per GPU "
        f"({_size(last.kv_bytes)} of KV) and takes {row['measured_ms']:,.4g} ms: "
        f"{ratio:,.3g}x its floor of {row['floor_ms']:#.3g} ms" + cause,
        sev,
        (f"bytes per step (computed from the model geometry): KV {_size(last.kv_bytes)} + weights "
         f"{_size(last.weight_bytes)} = {_size(last.total_bytes)} per GPU",
         f"peak bandwidth {gb_s(peak_gb_s)} ({peaks.memory_bandwidth.label}: {peaks.memory_bandwidth.detail})",
         f"memory floor {row['memory_floor_ms']:.4g} ms (KV alone {row['kv_floor_ms']:.4g} ms); compute floor "
         + (f"{row['compute_floor_ms']:.4g} ms" if row["compute_floor_ms"] is not None else "unknown (no matmul peak)")
         + " (computed)",
         f"measured step {row['measured_ms']:,.4g} ms ({source}); effective bandwidth {row['effective_gb_s_total']:.4g} GB/s "
         f"over all bytes, {row['effective_gb_s_kv']:.4g} GB/s over the KV alone = {row['pct_of_peak_total']:.3g}% / "
         f"{row['pct_of_peak_kv']:.3g}% of peak",
         f"threshold: measured over floor >= {floor_ratio_threshold:g}x is critical, >= 2x a warning"),
        {"context_tokens": last.context_tokens, "kv_gb_per_step": row["kv_gb_per_step"],
         "weight_gb_per_step": row["weight_gb_per_step"], "total_gb_per_step": row["total_gb_per_step"],
         "memory_floor_ms": row["memory_floor_ms"], "kv_floor_ms": row["kv_floor_ms"],
         "compute_floor_ms": row["compute_floor_ms"], "floor_ms": row["floor_ms"],
         "measured_ms": row["measured_ms"], "measured_over_floor_x": ratio,
         "effective_gb_s_kv": row["effective_gb_s_kv"], "effective_gb_s_total": row["effective_gb_s_total"],
         "pct_of_peak_kv": row["pct_of_peak_kv"], "pct_of_peak_total": row["pct_of_peak_total"],
         "peak_gb_s": peak_gb_s},
        source))
    if cmp is not None:
        r = cmp.ratio
        grows = cmp.measured.slope > 0
        sev = "ok" if not grows else "critical" if r >= slope_ratio_threshold else "warning" if r >= 2 else "ok"
        verdict = (
            f"The measured step grows {cmp.measured.slope_per_1k:.3g} ms per 1k tokens of context; the bytes it must "
            f"read grow the floor by {cmp.floor.slope_per_1k:.3g} ms per 1k: {r:,.3g}x."
            + (" The context-dependent work (the attention over the KV) is under suspicion." if sev == "critical" else "")
            if grows else
            f"The measured step does not grow with context here ({cmp.measured.slope_per_1k:.3g} ms per 1k tokens over "
            f"{cmp.measured.n} contexts, within noise); the floor grows {cmp.floor.slope_per_1k:.3g} ms per 1k. The "
            f"context is not what makes this step slow.")
        found.append(Finding(
            "bandwidth.slope", "Step-time slope vs the floor's slope", verdict,
            sev,
            (f"measured: {cmp.measured.slope_per_1k:.4g} ms per 1k tokens (least squares over {cmp.measured.n} "
             f"contexts, r² {cmp.measured.r2:.3f}; {source})",
             f"memory floor: {cmp.floor.slope_per_1k:.4g} ms per 1k tokens (computed: KV bytes per 1k tokens / peak)",
             f"threshold: slope ratio >= {slope_ratio_threshold:g}x is critical, >= 2x a warning"),
            {"measured_slope_ms_per_1k_tokens": cmp.measured.slope_per_1k,
             "floor_slope_ms_per_1k_tokens": cmp.floor.slope_per_1k, "slope_ratio_x": r,
             "measured_r2": cmp.measured.r2},
            source))
    if last.compute_floor_s is not None:
        bound = "compute" if last.compute_floor_s > last.memory_floor_s else "memory"
        found.append(Finding(
            "bandwidth.compute_bound", "Which floor binds",
            f"At {_tok(last.context_tokens)} the verify attention's compute floor is {1e3 * last.compute_floor_s:.3g} ms "
            f"and the memory floor {1e3 * last.memory_floor_s:.3g} ms: the step is {bound}-bound at best.",
            "info",
            (f"verify attention {last.verify_flops / 1e12:.4g} TFLOP per GPU per step (computed) at "
             f"{peaks.matmul_tflops:.4g} TFLOPS ({peaks.matmul.label if peaks.matmul else ''})",
             "a bandwidth floor alone understates the target when many heads x draft tokens make verify compute-bound"),
            {"compute_floor_ms": 1e3 * last.compute_floor_s, "memory_floor_ms": 1e3 * last.memory_floor_s,
             "bound": bound},
            "computed"))
    if quoted_attention_gb_s:
        t = implied_time_s(last.kv_bytes, quoted_attention_gb_s * 1e9)
        share = t / last.measured_step_s  # type: ignore[operator]
        found.append(Finding(
            "bandwidth.attention_only", "A quoted attention-only bandwidth, reconciled",
            f"Reading {_size(last.kv_bytes)} of KV at the quoted {quoted_attention_gb_s:g} GB/s takes "
            f"{t:.3g} s, {100 * share:.3g}% of the {last.measured_step_s:.4g} s step; over the whole step the KV "
            f"moves at {row['effective_gb_s_kv']:.3g} GB/s. The two agree only if the attention took that share "
            f"of the step.",
            "info",
            ("an effective bandwidth over the whole step divides the bytes by the whole step time; one over the "
             "attention divides them by the attention kernels' time alone, which is shorter, so it is higher",
             f"quoted {quoted_attention_gb_s:g} GB/s ({quoted_source}); KV bytes and step time as above"),
            {"quoted_attention_gb_s": quoted_attention_gb_s, "quoted_source": quoted_source, "implied_attention_s": t,
             "implied_attention_share_pct": 100 * share},
            "computed"))
    return found


def rows_for_table(steps: Sequence[StepRoofline]) -> list[dict[str, Any]]:
    return [s.as_row() for s in steps]


def measured_step_ms_by_context(summary: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """{context: step_ms} from :func:`specdiag.steps.baseline_sweep.summary.summarize_sweep` lines that have a step time."""
    return {int(s["context_tokens"]): float(s["step_ms"]) for s in summary if s.get("step_ms")}
