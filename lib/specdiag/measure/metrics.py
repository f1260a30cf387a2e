"""Per-request metrics from a request trace: the row every measuring step writes (the sweep's columns).
The per-context summary is :mod:`specdiag.measure.sweep_table`, the sweep's findings
:mod:`specdiag.steps.baseline_sweep.summary`.

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
  (:func:`specdiag.speculation.commit.commit_length_of`): SGLang ``(completion_tokens - 1) / spec_verify_ct``, vLLM
  ``1 + accepted drafts / verify steps``.

Everything here is a pure function: no I/O, no global state.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from specdiag.speculation.commit import commit_length_of

#: The columns of the ``sweep`` table, in order (docs/run-folder.md describes each with its unit).
SWEEP_COLUMNS: tuple[str, ...] = (
    "ts_unix_s", "context_tokens", "repeat", "prompt_kind", "seed", "max_new_tokens", "cache_flushed",
    "prompt_tokens", "prompt_tokens_match", "cached_tokens", "completion_tokens", "ttft_s", "prefill_tok_s", "decode_tok_s", "step_ms", "step_ms_method",
    "verify_steps", "commit_length", "accept_length", "n_chunks", "e2e_s", "server_e2e_s", "finish_reason",
    "error", "other_traffic", "traffic_evidence", "commit_length_reliable", "foreign_tokens_between",
    "server_restarted",
)
#: The traffic columns every measured row carries (specdiag.serving.traffic.traffic_columns).
TRAFFIC_COLUMNS: tuple[str, ...] = ("other_traffic", "traffic_evidence", "commit_length_reliable",
                                    "foreign_tokens_between", "server_restarted")


def positive(x: Any) -> float | None:
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
    ttft_s = positive(trace.ttft_s)
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
        "e2e_s": positive(trace.e2e_s),
        "server_e2e_s": positive(getattr(trace, "server_e2e_s", None)),
        "finish_reason": getattr(trace, "finish_type", None),
        "error": trace.error,
    })
    row.update(trace_columns(trace, row["commit_length"], row.get("cache_note")))
    return row


def trace_columns(trace: Any, commit_length: float | None, cache_note: str | None = None) -> dict[str, Any]:
    """What every measured row adds from its trace: the traffic columns (``other_traffic``, ``traffic_evidence``,
    ``commit_length_reliable``; :func:`specdiag.serving.traffic.traffic_columns`), and where set, ``spec_source``,
    ``warnings``, ``cache_note`` (why the prefix cache was not reset) and ``server_stages`` (SGLang's stage latencies
    of the request, :func:`specdiag.serving.stages.stage_deltas`: a prefill's chunks)."""
    from specdiag.serving.traffic import traffic_columns  # noqa: PLC0415 - pure, no HTTP client

    spec_source = getattr(trace, "spec_source", None)
    out = traffic_columns(getattr(trace, "traffic", None), spec_source, commit_length)
    warnings = list(getattr(trace, "warnings", None) or [])
    if out["commit_length_reliable"] is False:
        warnings.append("commit length from /metrics counter differences while other requests ran: unreliable")
    for key, value in (("spec_source", spec_source), ("warnings", warnings or None), ("cache_note", cache_note),
                       ("server_stages", getattr(trace, "server_stages", None))):
        if value is not None:
            out[key] = value
    return out


def error_row(context_tokens: int, error: str, ts_unix_s: float, **labels: Any) -> dict[str, Any]:
    """A ``sweep`` row for a request that produced no trace at all (the prompt could not be built,
    nothing could be sent); ``ts_unix_s`` is when it was attempted."""
    row: dict[str, Any] = {c: None for c in SWEEP_COLUMNS}
    row.update(ts_unix_s=ts_unix_s, context_tokens=int(context_tokens), **labels, error=error)
    return row


# ---------------------------------------------------------------------------------------------
# Least squares
# ---------------------------------------------------------------------------------------------
