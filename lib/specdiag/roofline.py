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

02 predicts its bandwidth from these, 05 sets its steps against them (its verdicts:
:mod:`specdiag.steps.bandwidth_analysis.verdicts`), 07 reads :data:`BELOW_FLOOR_X`; the prefill's floor is
:mod:`specdiag.prefill`, the roof as a figure :func:`specdiag.plots.roof`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from specdiag.geometry import (
    ExpertRouting,
    ModelGeometry,
    attention_span_tokens,
    kv_bytes_per_step,
    local_attention_heads,
    weight_bytes_per_step,
)
from specdiag.hardware import HardwarePeaks
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
