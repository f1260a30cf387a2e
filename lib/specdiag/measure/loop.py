"""Measure what is missing: the one loop of every notebook that measures request by request (01, 03, 04).

``plan.pending(run.done_keys(table, key))`` -> for each request: measure -> append its row(s) to the run at
once (a run that stops half-way keeps every row it measured) -> progress. Running the notebook again with the
same run folder measures only the requests without a good row (failed ones are measured again).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from tqdm import tqdm

#: What ``measure`` may return: one row for ``table``, or the row and further rows by table name.
Measured = Mapping[str, Any] | tuple[Mapping[str, Any], Mapping[str, Iterable[Mapping[str, Any]]]]


class Plan(Protocol):
    def requests(self) -> list[dict[str, Any]]: ...

    def pending(self, done: Iterable[tuple[Any, ...]]) -> list[dict[str, Any]]: ...


def measure_missing(run: Any, plan: Plan, table: str, key: Sequence[str],
                    measure: Callable[[dict[str, Any]], Measured], desc: str,
                    report: Callable[[str], None] = print, deadline_s: float | None = None,
                    not_run: list[str] | None = None) -> list[dict[str, Any]]:
    """Measure the plan's pending requests into ``run``; returns the rows measured now (``table``'s rows).

    ``report`` gets one line before the loop (how many are done already) and one per failed request. Past
    ``deadline_s`` (``time.monotonic()``, a sweep's budget) no request is started; ``not_run`` then gets a sentence.
    """
    total = len(plan.requests())
    pending = plan.pending(run.done_keys(table, tuple(key)))
    report(f"{total - len(pending)} of {total} requests already measured in this run folder; measuring {len(pending)}")
    measured: list[dict[str, Any]] = []
    for i, request in enumerate(tqdm(pending, desc=desc, unit="request", mininterval=2.0)):
        if deadline_s is not None and time.monotonic() > deadline_s:
            line = (f"{desc}: {len(pending) - i} of {total} requests not started (time budget), from "
                    + ", ".join(f"{k} {request.get(k)}" for k in key))
            report(line)
            if not_run is not None:
                not_run.append(line)
            break
        result = measure(request)
        row, more = (result if isinstance(result, tuple) else (result, {}))
        run.append_row(table, dict(row))
        for other, rows in more.items():
            for r in rows:
                run.append_row(other, dict(r))
        measured.append(dict(row))
        if row.get("error"):
            report(", ".join(f"{k} {request.get(k)}" for k in key) + f": FAILED: {row['error']}")
    return measured


def plan_rows(run: Any, plan: Plan, table: str, key: Sequence[str]) -> list[dict[str, Any]]:
    """The run's ``table`` rows of this plan, one per request in the plan's order: the last good row, else the
    last failed one (a resumed run measures failed requests again); requests without a row are left out."""
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in run.rows(table):
        k = tuple(row.get(f) for f in key)
        if k not in best or not row.get("error") or best[k].get("error"):
            best[k] = dict(row)
    keys = [tuple(q[f] for f in key) for q in plan.requests()]
    return [best[k] for k in keys if k in best]
