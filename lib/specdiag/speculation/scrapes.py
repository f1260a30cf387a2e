"""``/metrics`` scrapes: Prometheus exposition text parsed (prometheus_client's parser), a counter's total, and the
speculative-decoding numbers read from two scrapes' deltas (pure).

- SGLang: ``Δsglang:generation_tokens_total / Δsglang:spec_verify_calls_total`` (finished requests only; includes each
  request's prefill token).
- vLLM: mean acceptance length ``1 + Δvllm:spec_decode_num_accepted_tokens_total /
  Δvllm:spec_decode_num_drafts_total``.
"""

from __future__ import annotations

Samples = dict[str, list[tuple[dict[str, str], float]]]


def _samples(text: str) -> Samples:
    # imported here: prometheus_client loads its registry and HTTP exposition (about 85 ms), which replay never needs
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415 - loads prometheus_client (costly: ARCHITECTURE.md, Imports)

    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def parse_prometheus(text: str) -> Samples:
    """Parse Prometheus text exposition into ``{sample name: [(labels, value), ...]}``, with prometheus_client's
    parser (``prometheus_client.parser.text_string_to_metric_families``).

    Comments (``# HELP``/``# TYPE``) and blank lines are skipped; optional timestamps are dropped; values are
    floats (``+Inf``/``-Inf``/``NaN`` included). Histogram series keep their ``_bucket``/``_sum``/``_count``
    names; a counter's samples are named with ``_total`` (the parser's OpenMetrics convention: a sample of a
    counter typed without the suffix gets it; SGLang, vLLM and the embedded server write it already). A malformed
    line raises ValueError naming its number and text.
    """
    try:
        return _samples(text)
    except ValueError as exc:
        raise ValueError(_malformed(text, exc)) from None


def _malformed(text: str, exc: ValueError) -> str:
    """The first line the parser refuses on its own, numbered, for the error the whole text raised."""
    for lineno, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            _samples(raw + "\n")
        except ValueError as line_exc:
            return f"Prometheus text line {lineno}: {line_exc or 'unparsable'} in {raw!r}"
    return f"Prometheus text: {exc}"


def metric_total(samples: Samples, name: str, **label_filter: str) -> float | None:
    """Sum of a metric over all its label sets (optionally only those matching ``label_filter``).

    None when the metric is absent (or no label set matches).
    """
    rows = [v for labels, v in samples.get(name, []) if all(labels.get(k) == want for k, want in label_filter.items())]
    return sum(rows) if rows else None


def _delta(before: Samples, after: Samples, name: str) -> float | None:
    a = metric_total(after, name)
    if a is None:
        return None
    b = metric_total(before, name) or 0.0
    return a - b


def sglang_commit_length_from_scrapes(before: Samples, after: Samples) -> float | None:
    """Mean commit length between two SGLang scrapes:
    ``Δsglang:generation_tokens_total / Δsglang:spec_verify_calls_total``.

    Counts finished requests only and includes each one's prefill token (so it reads slightly
    above the per-step commit length for short outputs). None when no verify call happened or
    the counters are missing (server without ``--enable-metrics`` or speculative decoding).
    """
    tokens = _delta(before, after, "sglang:generation_tokens_total")
    calls = _delta(before, after, "sglang:spec_verify_calls_total")
    if tokens is None or calls is None or calls <= 0:
        return None
    return tokens / calls


def vllm_mean_acceptance_length(before: Samples, after: Samples) -> float | None:
    """vLLM's mean acceptance length between two scrapes: ``1 + Δaccepted_tokens / Δdrafts``."""
    accepted = _delta(before, after, "vllm:spec_decode_num_accepted_tokens_total")
    drafts = _delta(before, after, "vllm:spec_decode_num_drafts_total")
    if accepted is None or drafts is None or drafts <= 0:
        return None
    return 1.0 + accepted / drafts
