"""The server as a unit: which server and machine each request came from, the spread between servers, and the
comparison of two cells that counts it (pure).

Requests of one server are not independent of the server: two servers of the same configuration, started on lent
machines one after another, differ by more than the requests of one server do (on the H200: the plugin's four
servers at 1k, 4.40-6.29 ms a verify step; four 4-layer servers' fresh requests at 128k, 3.05-5.93 ms). So a
comparison of two cells first asks where their requests came from (:func:`compare_across`):

1. **one machine** (every request of both cells): the requests are compared
   (:func:`specdiag.stats.compare_requests`);
2. **a machine both cells measured on**, with at least :data:`~specdiag.stats.MIN_REQUESTS` requests of each there:
   those requests are compared, the others left out (said so);
3. **several machines**: the requests are compared, and a difference counts only where its interval also clears the
   **spread between servers** (``lo > spread`` for "higher", ``hi < 1 / spread`` for "lower"); else it is a tie
   inside that spread.

A row's **server** is its ``server`` field, else its arm and part (a sweep starts one server per arm and part); its
**machine** is its ``machine`` field (the sweep's host, :func:`specdiag.runs.machine_id`, stamped by ``specdiag
merge``), else its part (the parts of a merged run ran on lent machines not known to be one), else one machine (a
run of one part).

**The spread between servers** (:func:`server_spreads`): the largest ratio of two servers' medians of one cell (an arm
at a context measured on two or more servers), at each context; where no cell at a context has two servers, the
largest at any context of the run; where the run has none, :data:`DEFAULT_SPREAD_X`, the largest measured in the
recorded runs (tests/test_spread.py checks it against them). Each comes with the words that say where it came from.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any, Hashable, Mapping, Sequence

from specdiag.stats import MIN_REQUESTS, NOT_ENOUGH, RequestComparison, compare_requests

#: The largest spread between servers of one configuration measured in the recorded runs: sglang-h200-kv-tier0, arm
#: plugin at 128k, fresh requests of three servers (medians 3.36, 4.59 and 5.93 ms a verify step: 1.76x). Used only
#: where a run compares cells from several machines and measures no spread of its own.
DEFAULT_SPREAD_X = 1.8
DEFAULT_SPREAD_WHERE = ("not measured in this run: the largest of the recorded runs' (sglang-h200-kv-tier0, plugin's "
                        "fresh requests at 128k on three servers, 1.76x)")

ONE_MACHINE = "one machine"


@dataclass(frozen=True)
class Sample:
    """One request's value and where it came from."""

    value: float
    server: str = ""    #: the server that answered it
    machine: str = ""   #: the machine that server ran on ("" : the run's one machine)


def server_of(row: Mapping[str, Any]) -> str:
    """The server a row came from (module doc)."""
    if row.get("server"):
        return str(row["server"])
    part = row.get("part")
    arm = str(row.get("arm") or "")
    return f"{arm} (part {int(part)})" if _present(part) else arm


def machine_of(row: Mapping[str, Any]) -> str:
    """The machine a row came from (module doc): '' for a run of one part."""
    if row.get("machine"):
        return str(row["machine"])
    part = row.get("part")
    return f"part {int(part)}" if _present(part) else ""


def _present(v: Any) -> bool:
    try:
        return v is not None and v == v and str(v) != ""
    except (TypeError, ValueError):
        return False


def samples(rows: Sequence[Mapping[str, Any]], value: str) -> list[Sample]:
    """The rows' ``value`` as samples with their server and machine (rows without a finite value left out)."""
    out = []
    for r in rows:
        v = r.get(value)
        try:
            x = float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if x == x:
            out.append(Sample(x, server_of(r), machine_of(r)))
    return out


@dataclass(frozen=True)
class Spread:
    """The spread between servers a comparison must clear, and where it was measured."""

    x: float       #: the largest ratio of two servers' medians (>= 1)
    where: str     #: what it was measured on, in words

    def text(self) -> str:
        return f"{self.x:.2f}x ({self.where})"


DEFAULT_SPREAD = Spread(DEFAULT_SPREAD_X, DEFAULT_SPREAD_WHERE)


def _server_medians(cell: Sequence[Sample]) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for s in cell:
        by.setdefault(s.server, []).append(s.value)
    return {k: statistics.median(v) for k, v in by.items()}


def server_spreads(cells: Mapping[tuple[str, Hashable], Sequence[Sample]], unit: str = "",
                   label: Any = str) -> dict[Hashable, Spread]:
    """Per context (the second item of each cell's key; the first is the arm): the spread between servers that a
    comparison there must clear (module doc), for every context of ``cells``. ``unit`` is said beside the medians;
    ``label`` writes a context (e.g. 1k)."""
    measured: dict[Hashable, Spread] = {}
    for (arm, ctx), cell in cells.items():
        meds = _server_medians(cell)
        if len(meds) < 2 or min(meds.values()) <= 0:
            continue
        x = max(meds.values()) / min(meds.values())
        if ctx not in measured or x > measured[ctx].x:
            measured[ctx] = Spread(x, f"{arm} at {label(ctx)}: {len(meds)} servers {min(meds.values()):.3g}-"
                                      f"{max(meds.values()):.3g}{(' ' + unit) if unit else ''}")
    widest = max(measured.values(), key=lambda s: s.x) if measured else None
    out: dict[Hashable, Spread] = {}
    for _, ctx in cells:
        if ctx in measured:
            out[ctx] = measured[ctx]
        elif widest is not None:
            out[ctx] = Spread(widest.x, f"none at {label(ctx)}; the run's largest, {widest.where}")
        else:
            out[ctx] = DEFAULT_SPREAD
    return out


def _machines(cell: Sequence[Sample]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in cell:
        out[s.machine] = out.get(s.machine, 0) + 1
    return out


def compare_across(a: Sequence[Sample], b: Sequence[Sample], spread: Spread | None = None,
                   min_requests: int = MIN_REQUESTS) -> RequestComparison:
    """B against A with the server as a unit (module doc: one machine, a shared machine, or several machines and the
    spread between servers). ``rule`` on the result says which, ``request_verdict`` the requests' verdict alone."""
    ma, mb = _machines(a), _machines(b)
    if len(set(ma) | set(mb)) <= 1:
        c = compare_requests([s.value for s in a], [s.value for s in b], min_requests=min_requests)
        return replace(c, rule=ONE_MACHINE)
    shared = [m for m in set(ma) & set(mb) if ma[m] >= min_requests and mb[m] >= min_requests]
    if shared:
        m = max(shared, key=lambda k: (min(ma[k], mb[k]), ma[k] + mb[k], k))
        c = compare_requests([s.value for s in a if s.machine == m], [s.value for s in b if s.machine == m],
                             min_requests=min_requests)
        left = len(a) + len(b) - c.n_a - c.n_b
        return replace(c, rule=f"one machine ({m}) measured both: its {c.n_a} / {c.n_b} requests compared"
                                + (f", {left} from other machines left out" if left else ""))
    c = compare_requests([s.value for s in a], [s.value for s in b], min_requests=min_requests)
    sp = spread or DEFAULT_SPREAD
    rule = f"several machines: a difference must clear the spread between servers, {sp.text()}"
    if c.verdict == NOT_ENOUGH or c.lo is None or c.hi is None:
        return replace(c, rule=rule, spread_x=sp.x)
    verdict = "higher" if c.lo > sp.x else "lower" if c.hi < 1.0 / sp.x else "tie"
    return replace(c, verdict=verdict, rule=rule, spread_x=sp.x)


def widened(c: RequestComparison) -> tuple[float, float]:
    """The interval a target is read against: the comparison's own, widened on both sides by the spread between
    servers where it came from several machines (``lo / spread``, ``hi x spread``), so a target is met only where it
    clears that spread too. Needs an interval."""
    assert c.lo is not None and c.hi is not None
    x = c.spread_x or 1.0
    return c.lo / x, c.hi * x


def inside_spread(c: RequestComparison) -> bool:
    """Whether the requests alone would have called a difference that the spread between servers made a tie."""
    return c.verdict == "tie" and c.request_verdict in ("higher", "lower")


def rule_short(c: RequestComparison) -> str:
    """The rule in a few words for a table cell: 'one machine', 'one machine of several', 'several machines, spread
    1.43x'."""
    if not c.rule or c.rule == ONE_MACHINE:
        return ONE_MACHINE
    if c.rule.startswith("one machine"):
        return "one machine of several"
    return f"several machines, spread {c.spread_x:.2f}x" if c.spread_x else "several machines"
