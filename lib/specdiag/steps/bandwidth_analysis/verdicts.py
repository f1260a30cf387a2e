"""05's verdicts on the roofline of its measured steps (:mod:`specdiag.roofline`: the floors and how far a step is
from them), its table rows, and the step time per context it reads from 01's summary lines. Pure functions."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from specdiag.findings import Finding, Source
from specdiag.hardware import HardwarePeaks, gb_s
from specdiag.roofline import BELOW_FLOOR_X, StepRoofline, below_floor_cause, implied_time_s, slope_comparison


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
    """{context: step_ms} from :func:`specdiag.measure.sweep_table.summarize_sweep` lines that have a step time."""
    return {int(s["context_tokens"]): float(s["step_ms"]) for s in summary if s.get("step_ms")}
