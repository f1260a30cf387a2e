"""How a request's KV lies in a token-slot pool: runs of consecutive slots (pure, numpy only).

A page_size-1 pool (SGLang's ``TokenToKVPoolAllocator``, the embedded server's slot pool) gives each token of a
request one slot; the attention reads the request's KV through its slot indices (``kv_indices``, taken from
``req_to_token`` in sequence order). Where consecutive tokens sit in consecutive slots the reads stream; where they do
not, each new run starts a new, dependent gather. This module measures that:

- a **run** is a maximal stretch of the index list where each slot is the previous one + 1;
- ``share_in_long_runs``: the fraction of tokens that sit in runs of at least ``long_run`` slots (64 by default: a
  64-token page, the unit the kernel A/B's paged layout uses);
- ``runs_per_1k_tokens``: runs per 1,000 tokens (1,000 / mean run length). A contiguous request has one run.

Used by the embedded server (its final meta_info's ``kv_layout``), by 10_kv_layout's analysis, and as the CPU reference
of the SGLang plugin's on-GPU form (plugins/sglang/specdiag_sglang_plugin/layout.py). It lives in the base, not in
``steps/kv_layout``, because the embedded server may not import ``steps/``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

#: runs of at least this many consecutive slots count as long (one 64-token page)
LONG_RUN = 64


@dataclass(frozen=True)
class LayoutStats:
    """The layout of one request's slot indices."""

    tokens: int  # slot indices looked at (the request's prefix)
    runs: int  # maximal runs of consecutive slots
    tokens_in_long_runs: int  # tokens in runs of at least ``long_run`` slots
    longest_run: int  # tokens in the longest run
    long_run: int = LONG_RUN  # the threshold of a long run, tokens

    @property
    def share_in_long_runs(self) -> float:
        """Fraction of tokens in runs of at least ``long_run`` (1.0 for a contiguous request of >= long_run tokens)."""
        return self.tokens_in_long_runs / self.tokens if self.tokens else float("nan")

    @property
    def runs_per_1k_tokens(self) -> float:
        return 1000.0 * self.runs / self.tokens if self.tokens else float("nan")

    @property
    def mean_run(self) -> float:
        return self.tokens / self.runs if self.runs else float("nan")

    def as_dict(self) -> dict[str, Any]:
        """The fields and the derived numbers, JSON-ready (rows, meta_info)."""
        return {**asdict(self), "share_in_long_runs": round(self.share_in_long_runs, 6),
                "runs_per_1k_tokens": round(self.runs_per_1k_tokens, 4), "mean_run": round(self.mean_run, 3)}


def run_lengths(slots: Sequence[int] | np.ndarray) -> np.ndarray:
    """Lengths of the maximal runs of consecutive slots (slot[i+1] == slot[i] + 1), in order."""
    s = np.asarray(slots, dtype=np.int64).ravel()
    if s.size == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.diff(s) != 1) + 1
    edges = np.concatenate(([0], starts, [s.size]))
    return np.diff(edges)


def layout_stats(slots: Sequence[int] | np.ndarray, long_run: int = LONG_RUN) -> LayoutStats:
    """The layout of ``slots`` (a request's slot indices in sequence order)."""
    if long_run < 1:
        raise ValueError(f"long_run must be at least 1; got {long_run}")
    lens = run_lengths(slots)
    return LayoutStats(tokens=int(lens.sum()), runs=int(lens.size),
                       tokens_in_long_runs=int(lens[lens >= long_run].sum()),
                       longest_run=int(lens.max()) if lens.size else 0, long_run=long_run)


def from_dict(d: Mapping[str, Any]) -> LayoutStats:
    """A LayoutStats back from :meth:`LayoutStats.as_dict` (or the plugin's record: the same four counts)."""
    return LayoutStats(tokens=int(d["tokens"]), runs=int(d["runs"]), tokens_in_long_runs=int(d["tokens_in_long_runs"]),
                       longest_run=int(d.get("longest_run") or 0), long_run=int(d.get("long_run") or LONG_RUN))


def combine(stats: Iterable[LayoutStats]) -> LayoutStats | None:
    """Several requests' layouts as one (counts summed, the longest run kept); None for none."""
    items = list(stats)
    if not items:
        return None
    if len({s.long_run for s in items}) != 1:
        raise ValueError("cannot combine layouts measured with different long-run thresholds")
    return LayoutStats(tokens=sum(s.tokens for s in items), runs=sum(s.runs for s in items),
                       tokens_in_long_runs=sum(s.tokens_in_long_runs for s in items),
                       longest_run=max(s.longest_run for s in items), long_run=items[0].long_run)
