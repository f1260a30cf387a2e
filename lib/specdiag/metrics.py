"""Per-request sweep metrics from a request trace and the sweep's findings (the least-squares line lives in
:mod:`specdiag.stats` and is re-exported here).

Formulas (units in the names; times from the client's clock unless said otherwise):

- ``ttft_s``: send to the first chunk that brought tokens (measured).
- ``prefill_tok_s = prompt_tokens / ttft_s`` (tokens/s; TTFT includes queueing and the network, so
  this is a lower bound on the prefill rate).
- ``decode_tok_s = (completion_tokens - first chunk's tokens) / (last chunk time - first chunk time)``:
  the decode window starts when the first token arrives, so prefill is excluded (as SGLang's
  one_batch_server ``output_throughput`` does).
- ``step_ms = decode window / verify steps in the window`` (ms per verify step). With speculation the
  first chunk carries the prefill token and possibly the first verify steps' tokens, so the steps in
  the window are: exact from the embedded server's per-step commit lengths (``step_commits``), else
  ``verify_ct * (completion_tokens - first chunk's tokens) / (completion_tokens - 1)``
  (``verify_steps``; equal to verify_ct when the first chunk holds only the prefill token). Without
  speculation every decode step makes one token (``tokens``).
- ``commit_length``: tokens per verify step, bonus included, from the trace's engine-neutral spec fields
  (:func:`specdiag.spec.commit_length_of`): SGLang ``(completion_tokens - 1) / spec_verify_ct``, vLLM
  ``1 + accepted drafts / verify steps``.

Everything here is a pure function: no I/O, no global state.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from specdiag.findings import Finding, Source
from specdiag.spec import commit_length_of, pooled_commit_length
from specdiag.stats import LineFit, fit_line  # noqa: F401 - re-exported: callers of metrics.fit_line keep working

#: The columns of the ``sweep`` table, in order (docs/ARCHITECTURE.md describes each with its unit).
SWEEP_COLUMNS: tuple[str, ...] = (
    "ts_unix_s", "context_tokens", "repeat", "prompt_kind", "seed", "max_new_tokens", "cache_flushed",
    "prompt_tokens", "prompt_tokens_match", "cached_tokens", "completion_tokens", "ttft_s", "prefill_tok_s", "decode_tok_s", "step_ms", "step_ms_method",
    "verify_steps", "commit_length", "accept_length", "n_chunks", "e2e_s", "server_e2e_s", "finish_reason",
    "error",
)


def _positive(x: Any) -> float | None:
    """``x`` as a float when it is a finite number > 0, else None."""
    if x is None or isinstance(x, bool):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def verify_steps_in_window(first_chunk_tokens: int, completion_tokens: int, verify_ct: int | None,
                           step_commit_lengths: Sequence[int] | None = None) -> tuple[float | None, str | None]:
    """Verify steps that ran between the first and the last chunk, and how that was found.

    Returns ``(steps, method)``; ``(None, None)`` when it cannot be known (see the module docstring).
    """
    if verify_ct is not None and verify_ct > 0:
        if step_commit_lengths:
            in_first, steps_in_first = first_chunk_tokens - 1, 0
            for c in step_commit_lengths:
                if in_first < c:
                    break
                in_first -= c
                steps_in_first += 1
            return float(len(step_commit_lengths) - steps_in_first), "step_commits"
        if completion_tokens > 1:
            return verify_ct * (completion_tokens - first_chunk_tokens) / (completion_tokens - 1), "verify_steps"
        return None, None
    if verify_ct is None:
        return float(completion_tokens - first_chunk_tokens), "tokens"
    return None, None


def decode_window(chunk_t_s: Sequence[float], chunk_tokens: Sequence[int],
                  completion_tokens: int) -> tuple[float, int] | None:
    """The decode window of a stream: (seconds from the first to the last token chunk, tokens after
    the first chunk), or None when there is no such window (one chunk, or no token after the first)."""
    if len(chunk_t_s) < 2 or not chunk_tokens:
        return None
    window_s = chunk_t_s[-1] - chunk_t_s[0]
    decode_tokens = completion_tokens - chunk_tokens[0]
    return (window_s, decode_tokens) if window_s > 0 and decode_tokens > 0 else None


def decode_tok_s(chunk_t_s: Sequence[float], chunk_tokens: Sequence[int], completion_tokens: int) -> float | None:
    """Decode speed, tokens/s: tokens after the first chunk / (last chunk time - first chunk time)."""
    window = decode_window(chunk_t_s, chunk_tokens, completion_tokens)
    return window[1] / window[0] if window else None


def sweep_row(trace: Any, context_tokens: int, **labels: Any) -> dict[str, Any]:
    """One ``sweep`` row from a :class:`specdiag.serving.RequestTrace` (see :data:`SWEEP_COLUMNS`).

    ``labels`` (``repeat``, ``prompt_kind``, ``seed``, ...) are copied into the row. Fields that the
    trace cannot give (a failed request, a single chunk) are None; ``error`` carries the trace's error.
    """
    prompt_tokens = trace.prompt_tokens
    completion_tokens = int(trace.completion_tokens or 0)
    ttft_s = _positive(trace.ttft_s)
    chunk_t_s, chunk_tokens = list(trace.chunk_t_s or []), list(trace.chunk_tokens or [])

    rate_tok_s = step_ms = None
    method = None
    spec = getattr(trace, "spec", None)
    verify_ct = spec.verify_ct if spec is not None else None
    window = decode_window(chunk_t_s, chunk_tokens, completion_tokens)
    if window:
        window_s, decode_tokens = window
        rate_tok_s = decode_tokens / window_s
        steps, method = verify_steps_in_window(
            chunk_tokens[0], completion_tokens, verify_ct, spec.step_commit_lengths if spec is not None else None)
        step_ms = 1000.0 * window_s / steps if steps else None
        method = method if step_ms is not None else None

    row: dict[str, Any] = {c: None for c in SWEEP_COLUMNS}
    row.update({
        "ts_unix_s": trace.t_send_unix_s,
        "context_tokens": int(context_tokens),
        **labels,
        "prompt_tokens": prompt_tokens,
        "prompt_tokens_match": (prompt_tokens == context_tokens) if prompt_tokens is not None else None,
        "cached_tokens": getattr(trace, "cached_tokens", None),
        "completion_tokens": completion_tokens,
        "ttft_s": ttft_s,
        "prefill_tok_s": prompt_tokens / ttft_s if ttft_s and prompt_tokens else None,
        "decode_tok_s": rate_tok_s,
        "step_ms": step_ms,
        "step_ms_method": method,
        "verify_steps": verify_ct,
        "commit_length": commit_length_of(completion_tokens, spec),
        "accept_length": spec.accept_length if spec is not None else None,
        "n_chunks": len(chunk_t_s),
        "e2e_s": _positive(trace.e2e_s),
        "server_e2e_s": _positive(getattr(trace, "server_e2e_s", None)),
        "finish_reason": getattr(trace, "finish_type", None),
        "error": trace.error,
    })
    for key, value in (("spec_source", getattr(trace, "spec_source", None)),
                       ("warnings", list(getattr(trace, "warnings", None) or []) or None)):
        if value is not None:
            row[key] = value
    return row


def error_row(context_tokens: int, error: str, ts_unix_s: float, **labels: Any) -> dict[str, Any]:
    """A ``sweep`` row for a request that produced no trace at all (the prompt could not be built,
    nothing could be sent); ``ts_unix_s`` is when it was attempted."""
    row: dict[str, Any] = {c: None for c in SWEEP_COLUMNS}
    row.update(ts_unix_s=ts_unix_s, context_tokens=int(context_tokens), **labels, error=error)
    return row


# ---------------------------------------------------------------------------------------------
# Least squares
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Sweep summary and findings
# ---------------------------------------------------------------------------------------------

SUMMARY_FIELDS = ("ttft_s", "prefill_tok_s", "decode_tok_s", "step_ms", "e2e_s")


def _ok(row: Mapping[str, Any]) -> bool:
    return not row.get("error")


def summarize_sweep(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One line per context: requests, failures, medians of :data:`SUMMARY_FIELDS` over successful
    repeats, and the step-weighted commit length (``pooled_commit_length``). Sorted by context."""
    by_ctx: dict[int, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_ctx.setdefault(int(r["context_tokens"]), []).append(r)
    out = []
    for ctx in sorted(by_ctx):
        group = by_ctx[ctx]
        ok = [r for r in group if _ok(r)]
        line: dict[str, Any] = {"context_tokens": ctx, "requests": len(group), "failed": len(group) - len(ok)}
        for f in SUMMARY_FIELDS:
            vals = [float(r[f]) for r in ok if _positive(r.get(f)) is not None]
            line[f] = statistics.median(vals) if vals else None
        # Step-weighted: each row's committed tokens (commit_length x verify_steps, whatever the engine's
        # way of counting) over all its verify steps.
        weighted = [(float(r["commit_length"]), int(r["verify_steps"])) for r in ok
                    if r.get("commit_length") is not None and r.get("verify_steps")]
        pairs = [(int(r["completion_tokens"]), int(r["verify_steps"])) for r in ok
                 if r.get("completion_tokens") is not None and r.get("verify_steps")]
        published = [float(r["commit_length"]) for r in ok if r.get("commit_length") is not None]
        if weighted and len(weighted) == len(pairs):
            line["commit_length"] = sum(c * n for c, n in weighted) / sum(n for _, n in weighted)
        else:
            line["commit_length"] = pooled_commit_length(pairs) if pairs else (
                statistics.median(published) if published else None)
        out.append(line)
    return out


def _fmt(x: float, unit: str) -> str:
    return f"{x:.3g} {unit}" if abs(x) < 1000 else f"{x:,.0f} {unit}"


def sweep_findings(summary: Sequence[Mapping[str, Any]], source: Source = "measured",
                   rows: Sequence[Mapping[str, Any]] = ()) -> list[Finding]:
    """The baseline sweep's verdicts: step-time slope, decode collapse, commit length at long context,
    and failed or mis-sized requests. ``summary`` is :func:`summarize_sweep`'s output.

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
    return found
