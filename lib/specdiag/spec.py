"""Speculative-decoding math and parsers: commit lengths, server log lines, Prometheus text.

Vocabulary (the same in every notebook):

- **verify step**: one target forward pass that checks a block of drafted tokens.
- **commit length**: tokens a verify step adds to the output, the bonus token included
  (SGLang's ``accept len`` / ``spec_accept_length``, DFlash's ``commit_len``, the DDTree lines'
  ``avg_commit_len``). Always >= 1.
- **accepted drafts** (``correct drafts``): commit length - 1.

Sources of the formulas (SGLang 0.5.17, its replies recorded in tests/data/sglang-0.5.17/):

- Per request, exact: ``(completion_tokens - 1) / spec_verify_ct``; the first output token comes
  from prefill, not from a verify step. ``1 + sum(i * hist[i]) / sum(hist)`` over
  ``spec_correct_drafts_histogram`` (index = correct drafts in a step, value = steps) is only a fallback:
  real SGLang 0.5.17 counts in the histogram (and in ``spec_num_correct_drafts``) the drafts the last
  verify step accepted past ``max_new_tokens``, which never reach the output, so it can read higher
  (recorded: 1.84 against the exact 1.63, tests/test_sglang_0517_contract.py).
  SGLang's own ``spec_accept_length`` is ``completion_tokens / spec_verify_ct`` (it counts the
  prefill token too, so it is slightly higher for short outputs).
- Between two ``/metrics`` scrapes: ``Δsglang:generation_tokens_total / Δsglang:spec_verify_calls_total``
  (finished requests only; includes each request's prefill token).
- vLLM: mean acceptance length ``1 + Δvllm:spec_decode_num_accepted_tokens_total /
  Δvllm:spec_decode_num_drafts_total``.

Everything here is a pure function of its arguments: no I/O, no global state.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any
from collections.abc import Iterable, Mapping, Sequence

from specdiag.stats import quantile

# Field names in SGLang's final meta_info, current name first, older releases after.
VERIFY_CT_KEYS = ("spec_verify_ct",)
ACCEPT_LENGTH_KEYS = ("spec_accept_length",)
CORRECT_DRAFTS_KEYS = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
PROPOSED_DRAFTS_KEYS = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
HISTOGRAM_KEYS = ("spec_correct_drafts_histogram", "spec_accept_histogram")
# Extras that only specdiag's embedded server sends (per verify step of this request).
STEP_COMMIT_KEY = "spec_step_commit_lengths"
STEP_DRAFT_MS_KEY = "spec_step_draft_ms"
STEP_VERIFY_MS_KEY = "spec_step_verify_ms"


def _first(meta: Mapping[str, Any], keys: Sequence[str]) -> Any:
    for key in keys:
        if key in meta and meta[key] is not None:
            return meta[key]
    return None


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class SpecFields:
    """Speculative-decoding fields of one request, from its final meta_info (server-reported)."""

    verify_ct: int | None  # verify steps for this request
    accept_length: float | None  # SGLang's completion_tokens / verify_ct (prefill token included)
    num_correct_drafts: int | None  # drafted tokens the target accepted, summed over steps
    num_proposed_drafts: int | None  # drafted tokens proposed, summed over steps
    correct_drafts_histogram: list[int] | None  # index = correct drafts in a step, value = steps
    step_commit_lengths: list[int] | None  # embedded server only: tokens committed per step
    step_draft_ms: list[float] | None  # embedded server only: drafting time per step, ms
    step_verify_ms: list[float] | None  # embedded server only: verify time per step, ms
    # Tokens per verify step, bonus included, as the engine counted them (vLLM: 1 + accepted / steps);
    # None where the engine gives counts only (SGLang: see commit_length_of).
    mean_commit_length: float | None = None

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any] | None) -> SpecFields | None:
        """Read the fields under current and older SGLang names; None if the request has none."""
        return spec_fields_from_meta(meta)


def spec_fields_from_meta(meta: Mapping[str, Any] | None) -> SpecFields | None:
    """SpecFields from a final meta_info, or None when it carries no speculative field at all."""
    if not meta:
        return None
    hist = _first(meta, HISTOGRAM_KEYS)
    steps = meta.get(STEP_COMMIT_KEY)
    draft_ms = meta.get(STEP_DRAFT_MS_KEY)
    verify_ms = meta.get(STEP_VERIFY_MS_KEY)
    fields = SpecFields(
        verify_ct=_int_or_none(_first(meta, VERIFY_CT_KEYS)),
        accept_length=_float_or_none(_first(meta, ACCEPT_LENGTH_KEYS)),
        num_correct_drafts=_int_or_none(_first(meta, CORRECT_DRAFTS_KEYS)),
        num_proposed_drafts=_int_or_none(_first(meta, PROPOSED_DRAFTS_KEYS)),
        correct_drafts_histogram=[int(v) for v in hist] if hist is not None else None,
        step_commit_lengths=[int(v) for v in steps] if steps is not None else None,
        step_draft_ms=[float(v) for v in draft_ms] if draft_ms is not None else None,
        step_verify_ms=[float(v) for v in verify_ms] if verify_ms is not None else None,
    )
    if all(v is None for v in vars(fields).values()):
        return None
    return fields


# ---------------------------------------------------------------------------------------------
# Commit length per request
# ---------------------------------------------------------------------------------------------


def commit_length_from_counts(completion_tokens: int | None, verify_ct: int | None) -> float | None:
    """Mean commit length of one request: ``(completion_tokens - 1) / verify_ct``.

    The first output token comes from prefill, every other one from a verify step.
    None when there was no verify step.
    """
    if verify_ct is None or completion_tokens is None or verify_ct <= 0:
        return None
    return (completion_tokens - 1) / verify_ct


def commit_length_from_histogram(correct_drafts_histogram: Sequence[int]) -> float | None:
    """Mean commit length from SGLang's histogram: ``1 + Σ i·hist[i] / Σ hist``. None if empty."""
    steps = sum(correct_drafts_histogram)
    if steps <= 0:
        return None
    return 1.0 + sum(i * n for i, n in enumerate(correct_drafts_histogram)) / steps


def commit_length_from_meta(meta: Mapping[str, Any]) -> float | None:
    """Mean commit length per verify step of one request, from its final meta_info.

    Uses, in order: completion_tokens and spec_verify_ct; the correct-drafts histogram; the
    embedded server's per-step commit lengths. None when the request has no speculative fields.
    """
    value = commit_length_from_counts(meta.get("completion_tokens"), _first(meta, VERIFY_CT_KEYS))
    if value is not None:
        return value
    hist = _first(meta, HISTOGRAM_KEYS)
    if hist:
        value = commit_length_from_histogram(hist)
        if value is not None:
            return value
    steps = meta.get(STEP_COMMIT_KEY)
    if steps:
        return sum(steps) / len(steps)
    return None


def commit_length_of(completion_tokens: int | None, spec: SpecFields | None) -> float | None:
    """Mean commit length of one request from its engine-neutral SpecFields (never an engine's keys).

    In order: the engine's own per-step mean (vLLM); ``(completion_tokens - 1) / verify_ct`` (SGLang);
    the correct-drafts histogram; the per-step commit lengths. None without speculative fields.
    """
    if spec is None:
        return None
    if spec.mean_commit_length is not None:
        return float(spec.mean_commit_length)
    value = commit_length_from_counts(completion_tokens, spec.verify_ct)
    if value is not None:
        return value
    if spec.correct_drafts_histogram:
        value = commit_length_from_histogram(spec.correct_drafts_histogram)
        if value is not None:
            return value
    if spec.step_commit_lengths:
        return sum(spec.step_commit_lengths) / len(spec.step_commit_lengths)
    return None


def pooled_commit_length(pairs: Iterable[tuple[int, int]]) -> float | None:
    """Step-weighted mean commit length over requests: ``Σ(completion_tokens - 1) / Σ verify_ct``.

    ``pairs`` holds ``(completion_tokens, verify_ct)`` per request; requests without verify steps
    are skipped. This weights every verify step equally (a mean of per-request means would not).
    """
    tokens = steps = 0
    for completion_tokens, verify_ct in pairs:
        if verify_ct and verify_ct > 0:
            tokens += completion_tokens - 1
            steps += verify_ct
    return tokens / steps if steps else None


def accepted_drafts(commit_lengths: Sequence[int]) -> list[int]:
    """Accepted (correct) drafts per step: commit length - 1."""
    return [int(c) - 1 for c in commit_lengths]


# ---------------------------------------------------------------------------------------------
# Per-step statistics (embedded server's spec_step_commit_lengths)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommitStats:
    """Summary of per-step commit lengths (tokens per verify step, bonus included)."""

    n_steps: int
    mean: float
    median: float
    std: float  # population standard deviation
    p10: float
    p90: float
    min: int
    max: int
    mean_accepted_drafts: float  # mean - 1


def step_commit_stats(step_commit_lengths: Sequence[int]) -> CommitStats:
    """Mean, median, spread and extremes of per-step commit lengths."""
    if not step_commit_lengths:
        raise ValueError("step_commit_lengths is empty: no verify step to summarize")
    values = sorted(int(v) for v in step_commit_lengths)
    if values[0] < 1:
        raise ValueError(f"a commit length must be >= 1 (the bonus token), got {values[0]}")
    mean = sum(values) / len(values)
    return CommitStats(
        n_steps=len(values),
        mean=mean,
        median=float(statistics.median(values)),
        std=statistics.pstdev(values),
        p10=quantile(values, 0.10),
        p90=quantile(values, 0.90),
        min=values[0],
        max=values[-1],
        mean_accepted_drafts=mean - 1.0,
    )


def commit_histogram(step_commit_lengths: Sequence[int], max_len: int | None = None) -> list[int]:
    """Steps per commit length: ``hist[k]`` = steps that committed k tokens (``hist[0]`` is 0).

    ``max_len`` (e.g. speculative_num_draft_tokens) fixes the length so histograms of different
    requests line up; a commit length above it is an error.
    """
    top = max(step_commit_lengths, default=0)
    if max_len is None:
        max_len = top
    elif top > max_len:
        raise ValueError(f"commit length {top} exceeds max_len={max_len}")
    hist = [0] * (max_len + 1)
    for c in step_commit_lengths:
        hist[int(c)] += 1
    return hist


def commit_histogram_from_correct_drafts(correct_drafts_histogram: Sequence[int]) -> list[int]:
    """Convert SGLang's correct-drafts histogram (index = drafts) to commit lengths (index = tokens)."""
    return [0, *[int(n) for n in correct_drafts_histogram]]


# ---------------------------------------------------------------------------------------------
# Server log lines
# ---------------------------------------------------------------------------------------------

# "[2026-01-01 12:00:00 TP0] " or "[2026-01-01 12:00:00.123 DP1 TP0] " or "[2026-01-01 12:00:00] "
_LOG_PREFIX = re.compile(
    r"^\s*\[(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)(?P<rank>(?:\s+[A-Z]{2,4}\d+)*)\s*\]\s*"
)
_DECODE_HEAD = re.compile(r"Decode batch(?:\s*\[(?P<iter>\d+)\])?\s*[.,]\s*")
_PREFILL_HEAD = re.compile(r"Prefill batch(?:\s*\[(?P<iter>\d+)\])?\s*[.,]\s*")


@dataclass(frozen=True)
class DecodeLogLine:
    """One SGLang ``Decode batch`` log line (server-reported, over one decode log interval)."""

    ts: str | None  # the line's timestamp text, as printed
    rank: str | None  # "TP0", "DP1 TP0", ... or None
    iteration: int | None  # forward iteration (only with SGLANG_LOG_FORWARD_ITERS)
    running_req: int | None
    num_token: int | None  # "#token" (KV tokens in use); None on hybrid models
    token_usage: float | None
    accept_len: float | None  # commit length (accepted drafts + bonus), mean over the interval
    accept_rate: float | None  # correct drafts / proposed drafts
    cuda_graph: bool | None
    gen_throughput_tok_s: float | None
    queue_req: int | None
    fields: dict[str, str]  # every "key: value" pair of the line, raw


@dataclass(frozen=True)
class PrefillLogLine:
    """One SGLang ``Prefill batch`` log line."""

    ts: str | None
    rank: str | None
    new_seq: int | None
    new_token: int | None
    cached_token: int | None
    input_throughput_tok_s: float | None
    fields: dict[str, str]


def _split_prefix(line: str) -> tuple[str | None, str | None, str]:
    m = _LOG_PREFIX.match(line)
    if not m:
        return None, None, line
    rank = " ".join(m.group("rank").split()) or None
    return m.group("ts"), rank, line[m.end():]


def _key_values(body: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in body.strip().rstrip(",").split(", "):
        key, sep, value = part.partition(": ")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _num(fields: Mapping[str, str], *keys: str, kind: type = float) -> Any:
    for key in keys:
        if key in fields:
            text = fields[key].rstrip("%")
            try:
                return kind(float(text)) if kind is int else kind(text)
            except ValueError:
                return None
    return None


def _bool(fields: Mapping[str, str], *keys: str) -> bool | None:
    for key in keys:
        if key in fields:
            return {"true": True, "false": False}.get(fields[key].lower())
    return None


def parse_decode_log_line(line: str) -> DecodeLogLine | None:
    """Parse SGLang's ``Decode batch[.,] ...`` line; None for any other line.

    Accepts the timestamp/TP/DP prefix or none, ``Decode batch [iter],`` and the older
    ``Decode batch.`` form, and optional parts (accept len/rate, cap len, hybrid-model token
    counts, ``cuda graph`` / ``cpu graph`` / ``npu graph``, MFU estimates).
    """
    ts, rank, rest = _split_prefix(line.rstrip("\r\n"))
    m = _DECODE_HEAD.search(rest)
    if not m:
        return None
    fields = _key_values(rest[m.end():])
    if not fields:
        return None
    graph_keys = [k for k in fields if k.endswith(" graph")]
    return DecodeLogLine(
        ts=ts,
        rank=rank,
        iteration=int(m.group("iter")) if m.group("iter") else None,
        running_req=_num(fields, "#running-req", kind=int),
        num_token=_num(fields, "#token", kind=int),
        token_usage=_num(fields, "token usage"),
        accept_len=_num(fields, "accept len"),
        accept_rate=_num(fields, "accept rate"),
        cuda_graph=_bool(fields, *graph_keys) if graph_keys else None,
        gen_throughput_tok_s=_num(fields, "gen throughput (token/s)"),
        queue_req=_num(fields, "#queue-req", kind=int),
        fields=fields,
    )


def parse_prefill_log_line(line: str) -> PrefillLogLine | None:
    """Parse SGLang's ``Prefill batch, ...`` line; None for any other line."""
    ts, rank, rest = _split_prefix(line.rstrip("\r\n"))
    m = _PREFILL_HEAD.search(rest)
    if not m:
        return None
    fields = _key_values(rest[m.end():])
    if not fields:
        return None
    return PrefillLogLine(
        ts=ts,
        rank=rank,
        new_seq=_num(fields, "#new-seq", kind=int),
        new_token=_num(fields, "#new-token", kind=int),
        cached_token=_num(fields, "#cached-token", kind=int),
        input_throughput_tok_s=_num(fields, "input throughput (token/s)"),
        fields=fields,
    )


def parse_decode_log(lines: Iterable[str]) -> list[DecodeLogLine]:
    """Every decode line of a server log, in order (other lines skipped)."""
    out = []
    for line in lines:
        parsed = parse_decode_log_line(line)
        if parsed is not None:
            out.append(parsed)
    return out


_COMMIT_STAT_NAMES = ("avg_commit_len", "avg_accepted_depth", "avg_accepted_drafts")
_COMMIT_STAT = re.compile(
    r"\b(?P<key>" + "|".join(_COMMIT_STAT_NAMES) + r")\s*[=:]\s*"
    r"(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)",
    re.IGNORECASE,
)


def parse_commit_stats_line(line: str) -> dict[str, float] | None:
    """Parse the investigation's DDTree-style line ``avg_commit_len = F, avg_accepted_depth = F,
    avg_accepted_drafts = F`` (any subset, any order, ``=`` or ``:``).

    Returns ``{name: value}`` for the names found, or None when the line has none of them.
    Meaning (per step): avg_commit_len = tokens committed (bonus included) = avg_accepted_drafts + 1;
    avg_accepted_depth = length of the accepted tree path, excluding the root.
    """
    found = {m.group("key").lower(): float(m.group("value")) for m in _COMMIT_STAT.finditer(line)}
    return found or None


# ---------------------------------------------------------------------------------------------
# Prometheus exposition text
# ---------------------------------------------------------------------------------------------

Samples = dict[str, list[tuple[dict[str, str], float]]]


def _samples(text: str) -> Samples:
    # imported here: prometheus_client loads its registry and HTTP exposition (about 85 ms), which replay never needs
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

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
