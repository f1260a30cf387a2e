"""Interval sums for trace analysis: the length of a union, and a union's length shared out by label.

Pure functions over ``(start, end)`` pairs in any one unit (the trace analysis passes µs). Empty and
reversed intervals (end <= start) count for nothing.
"""

from __future__ import annotations

from typing import Iterable


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals."""
    total, cur_start, cur_end = 0.0, 0.0, None
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def shared_by_label_us(intervals: Iterable[tuple[float, float, str]]) -> dict[str, float]:
    """The union's length per label, each moment shared equally by the intervals covering it: two
    intervals overlapping for 10 give 5 to each one's label. The values add up to :func:`union_us`."""
    edges = sorted(edge for s, e, label in intervals if e > s for edge in ((s, 1, label), (e, -1, label)))
    out: dict[str, float] = {}
    active: dict[str, int] = {}
    n_active, last = 0, 0.0
    for t, delta, label in edges:
        if n_active and t > last:
            for lab, k in active.items():
                if k:
                    out[lab] = out.get(lab, 0.0) + (t - last) * k / n_active
        active[label] = active.get(label, 0) + delta
        n_active += delta
        last = t
    return out


def innermost_segments(intervals: Iterable[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Flatten nested labelled intervals into one lane: ``(start, end, label)`` pieces that do not overlap,
    each moment given to the innermost interval covering it (the one that started last; on a tie the one
    that ends first). Calls on one thread nest, so this says which call the thread was in at each moment.
    Adjacent pieces of the same label are merged; moments no interval covers are left out."""
    items = [(s, e, label) for s, e, label in intervals if e > s]
    edges = sorted({t for s, e, _ in items for t in (s, e)})
    by_start = sorted(range(len(items)), key=lambda i: items[i][0])
    out: list[tuple[float, float, str]] = []
    active: set[int] = set()
    nxt = 0
    for a, b in zip(edges, edges[1:]):
        while nxt < len(by_start) and items[by_start[nxt]][0] <= a:
            active.add(by_start[nxt])
            nxt += 1
        active = {i for i in active if items[i][1] > a}
        if not active:
            continue
        inner = max(active, key=lambda i: (items[i][0], -items[i][1], i))
        label = items[inner][2]
        if out and out[-1][1] == a and out[-1][2] == label:
            out[-1] = (out[-1][0], b, label)
        else:
            out.append((a, b, label))
    return out
