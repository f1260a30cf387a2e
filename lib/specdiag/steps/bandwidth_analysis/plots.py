"""Plots of the bandwidth analysis (notebook 05): the step against its floors, the effective bandwidth, the
verify attention on the roofline (under :func:`specdiag.plots.roof`, which 06 draws its kernels under too).

Each panel function draws on the Axes it is given; :func:`figure` puts the three side by side.
"""

from __future__ import annotations

from typing import Any, Sequence

import matplotlib.pyplot as plt
import pandas as pd

from specdiag import plots
from specdiag.hardware import HardwarePeaks, gb_s
from specdiag.roofline import StepRoofline


def step_vs_floors(ax: Any, steps: Sequence[StepRoofline], step_source: str, has_matmul: bool) -> None:
    """Measured step time per context against the memory floor (KV + weights), the KV floor and, with a
    matmul peak, the verify attention's compute floor (ms, log)."""
    ctxs = [s.context_tokens for s in steps]
    ax.plot(ctxs, [1e3 * s.measured_step_s for s in steps], "o-", color="C3", label=f"measured step ({step_source})")
    ax.plot(ctxs, [1e3 * s.memory_floor_s for s in steps], "s--", color="C0", label="memory floor: KV + weights")
    ax.plot(ctxs, [1e3 * s.kv_floor_s for s in steps], ":", color="C0", label="KV floor")
    if has_matmul:
        ax.plot(ctxs, [1e3 * s.compute_floor_s for s in steps], "^--", color="C2", label="compute floor (verify attention)")
    plots.context_axis(ax, ctxs)
    ax.set_yscale("log")
    ax.set_ylabel("time per step (ms)")
    ax.set_title("Step time vs its floors")
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    plots.source_note(ax, f"measured: {step_source}; floors computed")


def effective_bandwidth(ax: Any, steps: Sequence[StepRoofline], peaks: HardwarePeaks) -> None:
    """Bytes per step over the whole measured step (KV alone, all bytes) per context, against the peak (GB/s, log)."""
    ctxs = [s.context_tokens for s in steps]
    rows = [s.as_row() for s in steps]
    ax.plot(ctxs, [r["effective_gb_s_kv"] for r in rows], "o-", color="C3", label="effective, KV bytes")
    ax.plot(ctxs, [r["effective_gb_s_total"] for r in rows], "o--", color="C1", label="effective, all bytes")
    ax.axhline(peaks.memory_bandwidth_gb_s, color="k", lw=1,
               label=f"peak {gb_s(peaks.memory_bandwidth_gb_s)} ({peaks.memory_bandwidth.label})")
    plots.context_axis(ax, ctxs)
    ax.set_yscale("log")
    ax.set_ylabel("bandwidth (GB/s)")
    ax.set_title("Effective bandwidth over the whole step")
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    plots.source_note(ax, "computed: bytes / measured step time")


POINT_LABEL = "verify attention FLOPs / measured step"


def verify_points(steps: Sequence[StepRoofline]) -> pd.DataFrame:
    """One roofline point per context: intensity = verify FLOPs / KV bytes, achieved = FLOPs / measured step
    (TFLOP/s; an upper bound on what the attention reached, since the step holds more than the attention)."""
    return pd.DataFrame([{"context_tokens": s.context_tokens, "series": POINT_LABEL,
                          "intensity_flop_per_byte": s.verify_flops / s.kv_bytes,
                          "tflops": s.verify_flops / s.measured_step_s / 1e12}  # type: ignore[operator]
                         for s in steps if s.kv_bytes and s.measured_step_s])


def verify_roofline(ax: Any, steps: Sequence[StepRoofline], peaks: HardwarePeaks) -> None:
    """The verify attention of each measured step on the roofline of the device's peaks, first and last
    context labelled."""
    pts = verify_points(steps)
    bw, mm = peaks.memory_bandwidth_gb_s, peaks.matmul_tflops
    x = pts["intensity_flop_per_byte"] if len(pts) else pd.Series([1.0])
    ridge = [mm * 1e3 / bw] if mm else []
    plots.roof(ax, (max(0.05, min([float(x.min())] + ridge) / 4), max([float(x.max())] + ridge) * 4), bw, mm)
    ax.scatter(pts.get("intensity_flop_per_byte", []), pts.get("tflops", []), s=30, color="C3", label=POINT_LABEL,
               zorder=3)
    ax.legend(fontsize=7)
    plots.source_note(ax, "computed from the geometry, the peaks and the measured step")
    for _, p in pts.iloc[[0, -1]].iterrows() if len(pts) else []:
        ax.annotate(plots.format_tokens(p["context_tokens"]), (p["intensity_flop_per_byte"], p["tflops"]), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    ax.set_title("Roofline of the verify attention")


def figure(steps: Sequence[StepRoofline], peaks: HardwarePeaks, step_source: str) -> Any:
    """The three panels side by side: step vs floors, effective bandwidth, the roofline."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    step_vs_floors(axes[0], steps, step_source, has_matmul=peaks.matmul is not None)
    effective_bandwidth(axes[1], steps, peaks)
    verify_roofline(axes[2], steps, peaks)
    fig.tight_layout()
    return fig
