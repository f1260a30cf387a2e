"""Commit lengths per request and per verify step, from a server's final ``meta_info`` (the vocabulary:
:mod:`specdiag.speculation`).

Sources of the formulas (SGLang 0.5.17, its replies recorded in tests/data/sglang-0.5.17/):

- Per request, exact: ``(completion_tokens - 1) / spec_verify_ct``; the first output token comes
  from prefill, not from a verify step. ``1 + sum(i * hist[i]) / sum(hist)`` over
  ``spec_correct_drafts_histogram`` (index = correct drafts in a step, value = steps) is only a fallback:
  real SGLang 0.5.17 counts in the histogram (and in ``spec_num_correct_drafts``) the drafts the last
  verify step accepted past ``max_new_tokens``, which never reach the output, so it can read higher
  (recorded: 1.84 against the exact 1.63, tests/test_sglang_0517_contract.py).
  SGLang's own ``spec_accept_length`` is ``completion_tokens / spec_verify_ct`` (it counts the
  prefill token too, so it is slightly higher for short outputs).
- Per verify step: the embedded server's ``spec_step_commit_lengths`` (specdiag's own extra).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
