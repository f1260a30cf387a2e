"""SGLang's server log lines: the scheduler's ``Decode batch`` and ``Prefill batch`` lines and the DDTree runs'
commit statistics, parsed into typed records (pure)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

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
