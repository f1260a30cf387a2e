"""01_baseline_sweep's findings on its summary (one line per context,
:func:`specdiag.measure.sweep_table.summarize_sweep`): the step-time slope (:func:`specdiag.stats.fit_line`), a decode
collapse, the commit length at long context, failed or mis-sized requests. Pure functions."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from specdiag.findings import Finding, Source
from specdiag.measure.disturbance import traffic_finding
from specdiag.stats import fit_line


def _fmt(x: float, unit: str) -> str:
    return f"{x:.3g} {unit}" if abs(x) < 1000 else f"{x:,.0f} {unit}"


def sweep_findings(summary: Sequence[Mapping[str, Any]], source: Source = "measured",
                   rows: Sequence[Mapping[str, Any]] = ()) -> list[Finding]:
    """The baseline sweep's verdicts: step-time slope, decode collapse, commit length at long context,
    and failed or mis-sized requests. ``summary`` is :func:`specdiag.measure.sweep_table.summarize_sweep`'s output.

    Thresholds (judgement, stated in each finding's evidence): decode collapse >= 10x critical,
    >= 3x warning; step time at the longest context >= 3x the shortest's is a warning; a commit length
    <= 1.2 tokens per step at the longest context is a warning (the drafter commits almost nothing).
    """
    found: list[Finding] = []
    steps = [(s["context_tokens"], s["step_ms"]) for s in summary if s.get("step_ms") is not None]
    if len(steps) >= 2 and len({c for c, _ in steps}) >= 2:
        fit = fit_line([c for c, _ in steps], [m for _, m in steps])
        growth = steps[-1][1] / steps[0][1]
        endpoint = 1000.0 * (steps[-1][1] - steps[0][1]) / (steps[-1][0] - steps[0][0])
        found.append(Finding(
            "sweep.step_time_slope", "Step time vs context",
            f"Each verify step takes {fit.slope_per_1k:.3g} ms longer per 1,000 tokens of context "
            f"(least squares, r² = {fit.r2:.3f}); at {steps[-1][0]:,} tokens a step takes {growth:.3g}x "
            f"as long as at {steps[0][0]:,}." + (" Notebook 05 compares this slope with the memory floor."
                                                  if growth >= 3 else ""),
            "warning" if growth >= 3 else "info",
            (f"step_ms from {_fmt(steps[0][1], 'ms')} at {steps[0][0]:,} tokens to {_fmt(steps[-1][1], 'ms')} "
             f"at {steps[-1][0]:,} tokens ({source}, median over repeats)",
             f"least-squares line: {fit.slope_per_1k:.4g} ms per 1k tokens, intercept {fit.intercept:.4g} ms, "
             f"r² {fit.r2:.3f}, {fit.n} contexts (computed); between the end points {endpoint:.4g} ms per 1k",
             "warning when the longest context's step takes >= 3x the shortest's"),
            {"slope_ms_per_1k_tokens": fit.slope_per_1k, "intercept_ms": fit.intercept, "r2": fit.r2,
             "endpoint_slope_ms_per_1k_tokens": endpoint,
             "step_ms_first": steps[0][1], "step_ms_last": steps[-1][1], "step_growth_x": growth,
             "context_tokens_first": steps[0][0], "context_tokens_last": steps[-1][0]},
            source))
    dec = [(s["context_tokens"], s["decode_tok_s"]) for s in summary if s.get("decode_tok_s") is not None]
    if len(dec) >= 2:
        ratio = dec[0][1] / dec[-1][1]
        found.append(Finding(
            "sweep.decode_collapse", "Decode speed vs context",
            f"Decode falls {ratio:.3g}x from {dec[0][0]:,} to {dec[-1][0]:,} tokens of context "
            f"({_fmt(dec[0][1], 'tok/s')} to {_fmt(dec[-1][1], 'tok/s')}).",
            "critical" if ratio >= 10 else "warning" if ratio >= 3 else "ok",
            (f"decode_tok_s {_fmt(dec[0][1], 'tok/s')} at {dec[0][0]:,} tokens and {_fmt(dec[-1][1], 'tok/s')} "
             f"at {dec[-1][0]:,} tokens ({source}, median over repeats)",
             "collapse ratio = first / last decode tok/s (computed); >= 10x critical, >= 3x warning"),
            {"decode_collapse_x": ratio, "decode_tok_s_first": dec[0][1], "decode_tok_s_last": dec[-1][1],
             "context_tokens_first": dec[0][0], "context_tokens_last": dec[-1][0]},
            source))
    com = [(s["context_tokens"], s["commit_length"]) for s in summary if s.get("commit_length") is not None]
    if com:
        (c0, v0), (c1, v1) = com[0], com[-1]
        low = v1 <= 1.2
        found.append(Finding(
            "sweep.commit_length_long_context", "Commit length at long context",
            f"At {c1:,} tokens each verify step commits {v1:.2f} tokens (at {c0:,}: {v0:.2f})."
            + (" The drafter's guesses are almost all rejected here: notebook 04 (predictable text at the same "
               "contexts) tells a broken drafter from hard text." if low else ""),
            "warning" if low else "info",
            (f"commit length {v0:.2f} tokens/step at {c0:,} tokens, {v1:.2f} at {c1:,} tokens "
             f"(computed from {source} completion_tokens and verify steps; bonus token included)",
             "warning when <= 1.2 tokens per step (1.0 = no draft accepted)"),
            {"commit_length_last": v1, "commit_length_first": v0, "context_tokens_last": c1,
             "context_tokens_first": c0},
            source))
    failed = [r for r in rows if r.get("error")]
    if failed:
        found.append(Finding(
            "sweep.failed_requests", "Failed requests",
            f"{len(failed)} of {len(rows)} requests failed; their rows keep the error and are left out of the "
            f"medians.", "warning",
            tuple(f"{r['context_tokens']:,} tokens, repeat {r.get('repeat')}: {r['error']}" for r in failed[:5]),
            {"failed": len(failed), "requests": len(rows)}, source))
    mismatched = [r for r in rows if r.get("prompt_tokens_match") is False]
    if mismatched:
        found.append(Finding(
            "sweep.prompt_length_mismatch", "Prompt length differs from the requested context",
            f"For {len(mismatched)} requests the server counted a different prompt length than was sent; "
            f"those rows are plotted at the requested context.", "warning",
            tuple(f"sent {r['context_tokens']:,} tokens, server counted {r.get('prompt_tokens')}"
                  for r in mismatched[:5]),
            {"mismatched": len(mismatched)}, "server-reported"))
    traffic = traffic_finding(rows, "sweep")
    if traffic is not None:
        found.append(traffic)
    return found
