"""Shared summaries of raw samples: one quantile definition and one least-squares line.

Every notebook and module summarizes with these (telemetry phases, commit-length spreads, kernel
timings, step-time slopes), so a p90 or a slope means the same thing on every page.

- :func:`quantile`: linear interpolation between the two nearest order statistics, numpy's default
  ``method="linear"`` (Hyndman & Fan type 7): position ``(n - 1) * q`` in the sorted values.
- :func:`fit_line`: ordinary least squares ``y = slope * x + intercept`` with its r².
- :func:`median_diff_test`: the difference of two samples' medians (B - A) with exact one-sided Mann-Whitney
  p-values, so "B is slower than A" is said only where the ranks show it.
- :func:`compare_requests`: two cells of per-request values (a request's value is its own median over its steps;
  steps of one request are never independent samples), the ratio of their medians B / A with the distribution-free
  interval of the ratio over requests (:func:`ratio_interval`: the Mann-Whitney test inverted on log values, exact,
  no resampling), and its verdict: "higher" (the interval above 1), "lower" (below 1), "tie" (it holds 1), or "not
  enough requests" (fewer than :data:`MIN_REQUESTS` in a cell). The interval's **level is the one it has**
  (``RequestComparison.level``), never a nominal one: it aims at :data:`LEVEL` and reaches it from 3 against 5
  requests; 3 against 3 cannot, and there the interval is the range of the 9 request ratios, [min B / max A,
  max B / min A], at 90% (under no difference, a verdict other than "tie" comes 1 time in 10). A "no cost" reads its
  upper end: "no cost above (hi - 1)".
- :func:`against_target`: the same interval read against a target multiple (growth within 1.5x): "within" only where
  its upper end is at or below the target, "beyond" where its lower end is above it, else "spans".

Where requests come from several servers or machines, :mod:`specdiag.spread` adds the spread between servers to this
comparison.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Sequence


MIN_REQUESTS = 3        #: requests per cell before a comparison states a verdict
LEVEL = 0.95            #: the level an interval aims at; ``RequestComparison.level`` is the one it has
NOT_ENOUGH = "not enough requests"


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default), 0 <= q <= 1, of a non-empty sequence (any order)."""
    if not values:
        raise ValueError("quantile of an empty sequence")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be within [0, 1]; got {q!r}")
    s = sorted(float(v) for v in values)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class LineFit:
    """``y = slope * x + intercept`` by ordinary least squares; ``r2`` the coefficient of determination."""

    slope: float  # y units per x unit (ms per token for step_ms vs context_tokens)
    intercept: float  # y units
    r2: float  # 1 - SS_res / SS_tot (1.0 when every y is equal and fitted exactly)
    n: int  # points fitted

    @property
    def slope_per_1k(self) -> float:
        """Slope per 1,000 x units: ms per 1k tokens for step_ms vs context_tokens."""
        return 1000.0 * self.slope

    def predict(self, x: float) -> float:
        return self.slope * x + self.intercept


def fit_line(x: Sequence[float], y: Sequence[float]) -> LineFit:
    """Least-squares line through ``(x, y)``; needs two or more points with distinct x."""
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length ({len(x)} vs {len(y)})")
    pts = [(float(a), float(b)) for a, b in zip(x, y)]
    if len(pts) < 2:
        raise ValueError(f"a line needs at least 2 points; got {len(pts)}")
    if any(not (math.isfinite(a) and math.isfinite(b)) for a, b in pts):
        raise ValueError("x and y must be finite numbers (drop failed rows first)")
    mx = sum(a for a, _ in pts) / len(pts)
    my = sum(b for _, b in pts) / len(pts)
    sxx = sum((a - mx) ** 2 for a, _ in pts)
    if sxx == 0:
        raise ValueError("all x are equal: a slope needs at least two distinct x values")
    slope = sum((a - mx) * (b - my) for a, b in pts) / sxx
    intercept = my - slope * mx
    ss_tot = sum((b - my) ** 2 for _, b in pts)
    ss_res = sum((b - (slope * a + intercept)) ** 2 for a, b in pts)
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return LineFit(slope, intercept, r2, len(pts))


@dataclass(frozen=True)
class MedianDiff:
    """median(B) - median(A) (in the samples' unit: ms for step_ms) and one-sided rank-test p-values."""

    diff: float
    p_higher: float  # exact Mann-Whitney p of "B tends higher than A" (small: B slower, for step times)
    p_lower: float  # the same for "B tends lower"
    n_a: int
    n_b: int
    alpha: float = 0.05

    @property
    def verdict(self) -> str:
        """"higher" (p_higher < alpha), "lower" (p_lower < alpha) or "indistinguishable"."""
        return "higher" if self.p_higher < self.alpha else "lower" if self.p_lower < self.alpha else "indistinguishable"


@lru_cache(maxsize=256)
def _u_counts(m: int, n: int) -> list[int]:
    """How many of the C(m+n, m) orderings of m A's and n B's give each Mann-Whitney U (pairs with B above A)."""
    # f[i][j][u]: orderings of i A's and j B's with U = u; the largest value is an A (adds nothing) or a B (adds i)
    f = [[[1] for _ in range(n + 1)] for _ in range(m + 1)]
    for i in range(m + 1):
        for j in range(n + 1):
            if i == 0 or j == 0:
                continue
            size = i * j + 1
            counts = [0] * size
            for u, c in enumerate(f[i - 1][j]):
                counts[u] += c
            for u, c in enumerate(f[i][j - 1]):
                counts[u + i] += c
            f[i][j] = counts
    return f[m][n]


def median_diff_test(a: Sequence[float], b: Sequence[float], alpha: float = 0.05) -> MedianDiff:
    """median(b) - median(a) and the exact one-sided Mann-Whitney p-values (ties count one half), so "B is slower
    than A" is said only when the samples' ranks show it. Needs 2 or more values per sample, at most 60 each."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"median_diff_test needs 2 or more values per sample; got {len(a)} and {len(b)}: "
                         "measure more repeats (e.g. the sweep's repeats parameter)")
    if len(a) > 60 or len(b) > 60:
        raise ValueError(f"median_diff_test is exact and meant for repeats (<= 60 per sample); got {len(a)}, {len(b)}")
    fa, fb = [float(v) for v in a], [float(v) for v in b]
    u = sum(1.0 if y > x else 0.5 if y == x else 0.0 for x in fa for y in fb)  # pairs with B above A
    counts = _u_counts(len(fa), len(fb))
    total = sum(counts)
    p_higher = sum(c for k, c in enumerate(counts) if k >= u) / total
    p_lower = sum(c for k, c in enumerate(counts) if k <= u) / total
    return MedianDiff(statistics.median(fb) - statistics.median(fa), p_higher, p_lower, len(fa), len(fb), alpha)


@dataclass(frozen=True)
class RequestComparison:
    """Cell B against cell A over requests: medians, their ratio B / A, its interval and the verdict."""

    n_a: int                    #: requests in cell A
    n_b: int
    median_a: float | None      #: median over A's request values (the values' unit)
    median_b: float | None
    ratio: float | None         #: median_b / median_a
    lo: float | None            #: the interval's lower end (None: not enough requests)
    hi: float | None
    verdict: str                #: "higher", "lower", "tie" or "not enough requests"
    level: float | None = None  #: the interval's level, exact (:func:`ratio_interval`); None without an interval
    rule: str = ""              #: how servers entered the verdict (:mod:`specdiag.spread`); "" for one machine
    request_verdict: str = ""   #: the verdict from the requests alone, before the spread between servers
    spread_x: float | None = None  #: the spread between servers the verdict had to clear (None: one machine)

    @property
    def enough(self) -> bool:
        return self.verdict != NOT_ENOUGH

    def interval_text(self) -> str:
        """'1.02-1.10x' (or '' without an interval)."""
        return f"{self.lo:.3g}-{self.hi:.3g}x" if self.lo is not None and self.hi is not None else ""

    def level_text(self) -> str:
        """The interval's level as a page writes it, rounded down: '90%', '96%' ('' without an interval)."""
        return level_text(self.level) if self.level is not None else ""

    def named_interval(self) -> str:
        """'90% interval 1.02-1.10x' (or '' without an interval)."""
        return f"{self.level_text()} interval {self.interval_text()}" if self.interval_text() else ""

    def counts_text(self) -> str:
        """'3 / 3 requests'."""
        return f"{self.n_a} / {self.n_b} requests"


def level_text(level: float) -> str:
    """A level rounded down to a whole percent, so it never claims more: 0.9 -> '90%', 0.968 -> '96%'."""
    return f"{math.floor(100 * level + 1e-9):.0f}%"


def ratio_verdict(lo: float, hi: float) -> str:
    """"higher" (the interval above 1), "lower" (below 1) or "tie" (it holds 1)."""
    return "higher" if lo > 1.0 else "lower" if hi < 1.0 else "tie"


def _tail_count(m: int, n: int, alpha: float) -> tuple[int, float]:
    """The largest k >= 1 with P(U <= k - 1) <= alpha / 2 under no difference, and the level 1 - 2 P(U <= k - 1) it
    gives (k = 1 and its level where even that exceeds alpha / 2: too few requests for the aimed level). Exact up to
    1,600 request pairs, else the normal approximation of U (mean m n / 2, variance m n (m + n + 1) / 12)."""
    if m * n <= 1600:
        counts = _u_counts(m, n)
        total = float(sum(counts))
        cum, k = 0.0, 0
        while k < len(counts) and (cum + counts[k]) / total <= alpha / 2.0:
            cum += counts[k]
            k += 1
        if k == 0:
            return 1, 1.0 - 2.0 * counts[0] / total
        return k, 1.0 - 2.0 * cum / total

    z = NormalDist().inv_cdf(1.0 - alpha / 2.0)
    k = max(1, int(math.floor(m * n / 2.0 - z * math.sqrt(m * n * (m + n + 1) / 12.0))))
    return k, 1.0 - 2.0 * NormalDist().cdf((k - 1 + 0.5 - m * n / 2.0) / math.sqrt(m * n * (m + n + 1) / 12.0))


def ratio_interval(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(lo, hi, level it has) of the ratio B / A from positive per-request values: the k-th smallest and k-th largest
    of the m x n ratios b_j / a_i, k the largest count the exact Mann-Whitney distribution allows at ``level``
    (Moses' distribution-free interval of a shift, here on log values: a scale). Under no difference between the
    cells it excludes 1 with probability exactly 1 - level (ties aside). With too few requests for ``level`` (3
    against 3: at most 90%; 3 against 4: 94.3%) k is 1, the interval is the range of the ratios, and the level
    returned is the one that range has."""
    k, got = _tail_count(len(a), len(b), 1.0 - level)
    ratios = sorted(y / x for x in a for y in b)
    return ratios[k - 1], ratios[len(ratios) - k], got


def compare_requests(a: Sequence[float], b: Sequence[float], seed: int = 0,
                     min_requests: int = MIN_REQUESTS) -> RequestComparison:
    """B against A over per-request values (module doc): the ratio of the medians with :func:`ratio_interval`'s
    interval and its level; fewer than ``min_requests`` positive values in either cell, or a zero median in A:
    "not enough requests", no interval. ``seed`` is kept for callers and unused: the interval draws nothing."""
    del seed
    fa = [float(x) for x in a if x is not None and math.isfinite(float(x))]
    fb = [float(x) for x in b if x is not None and math.isfinite(float(x))]
    med_a = statistics.median(fa) if fa else None
    med_b = statistics.median(fb) if fb else None
    ratio = med_b / med_a if med_a and med_b is not None else None
    pa, pb = [x for x in fa if x > 0], [x for x in fb if x > 0]
    if len(pa) < min_requests or len(pb) < min_requests or not med_a or len(pa) < len(fa) or len(pb) < len(fb):
        return RequestComparison(len(fa), len(fb), med_a, med_b, ratio, None, None, NOT_ENOUGH)
    lo, hi, level = ratio_interval(pa, pb)
    verdict = ratio_verdict(lo, hi)
    return RequestComparison(len(fa), len(fb), med_a, med_b, ratio, lo, hi, verdict, level, "", verdict)


def no_cost_above(c: RequestComparison) -> str:
    """An upper bound from the interval: 'no cost above +4.1%' (or '' without an interval)."""
    return f"no cost above {100 * (c.hi - 1):+.1f}%" if c.hi is not None else ""


def against_target(c: RequestComparison, target: float) -> str:
    """A ratio's interval read against a target multiple (e.g. 1.5x growth): "within" (the upper end at or below it),
    "beyond" (the lower end above it), "spans" (the interval holds it: neither is shown) or "not enough requests"."""
    if c.lo is None or c.hi is None:
        return NOT_ENOUGH
    return "within" if c.hi <= target else "beyond" if c.lo > target else "spans"
