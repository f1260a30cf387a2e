"""01's ``sweep`` table read back (rows of :func:`specdiag.measure.metrics.sweep_row`, one per request; columns:
docs/run-folder.md): the row that counts for each request (:func:`latest_rows`), the successful requests' values per
context (:func:`samples_by_context`) and one summary line per context (:func:`summarize_sweep`). 01 writes the table;
05, 07 and 08 read it through here. Pure functions."""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Mapping

from specdiag.measure.disturbance import commit_usable
from specdiag.measure.metrics import positive
from specdiag.speculation.commit import pooled_commit_length

#: Fields that identify one request of a sweep (for resuming a run folder).
SWEEP_KEY = ("context_tokens", "repeat", "prompt_kind", "seed", "max_new_tokens")


def latest_rows(rows: Iterable[dict[str, Any]], requests: Iterable[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per request key (:data:`SWEEP_KEY`): the last successful one, else the last failed one.

    A resumed run re-measures failed requests, so a key can have an error row and a later good row.
    ``requests`` (``plan.requests()``) keeps only the rows of this plan; the order is the rows' order.
    """
    wanted = None if requests is None else {tuple(q[k] for k in SWEEP_KEY) for q in requests}
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        key = tuple(row.get(k) for k in SWEEP_KEY)
        if wanted is not None and key not in wanted:
            continue
        if key not in best or not row.get("error") or best[key].get("error"):
            best[key] = row
    return sorted(best.values(), key=lambda r: (r.get("context_tokens") or 0, r.get("repeat") or 0))


#: The per-request metrics a summary line holds the median of.
SUMMARY_FIELDS = ("ttft_s", "prefill_tok_s", "decode_tok_s", "step_ms", "e2e_s")


def _ok(row: Mapping[str, Any]) -> bool:
    return not row.get("error")


def samples_by_context(rows: Iterable[Mapping[str, Any]], field: str) -> dict[int, list[float]]:
    """The successful requests' positive values of ``field`` per context: the repeats a median (or a rank test,
    :func:`specdiag.stats.median_diff_test`) is taken over."""
    out: dict[int, list[float]] = {}
    for r in rows:
        if _ok(r) and positive(r.get(field)) is not None:
            out.setdefault(int(r["context_tokens"]), []).append(float(r[field]))
    return out


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
            vals = [float(r[f]) for r in ok if positive(r.get(f)) is not None]
            line[f] = statistics.median(vals) if vals else None
        # Step-weighted: each row's committed tokens (commit_length x verify_steps, whatever the engine's
        # way of counting) over all its verify steps.
        # A commit length from /metrics counter differences while others ran is unreliable: left out.
        usable = [r for r in ok if commit_usable(r)]
        weighted = [(float(r["commit_length"]), int(r["verify_steps"])) for r in usable
                    if r.get("commit_length") is not None and r.get("verify_steps")]
        pairs = [(int(r["completion_tokens"]), int(r["verify_steps"])) for r in usable
                 if r.get("completion_tokens") is not None and r.get("verify_steps")]
        published = [float(r["commit_length"]) for r in usable if r.get("commit_length") is not None]
        if weighted and len(weighted) == len(pairs):
            line["commit_length"] = sum(c * n for c, n in weighted) / sum(n for _, n in weighted)
        else:
            line["commit_length"] = pooled_commit_length(pairs) if pairs else (
                statistics.median(published) if published else None)
        out.append(line)
    return out
