"""Shared summaries of raw samples: one quantile definition and one least-squares line.

Every notebook and module summarizes with these (telemetry phases, commit-length spreads, kernel
timings, step-time slopes), so a p90 or a slope means the same thing on every page.

- :func:`quantile`: linear interpolation between the two nearest order statistics, numpy's default
  ``method="linear"`` (Hyndman & Fan type 7): position ``(n - 1) * q`` in the sorted values.
- :func:`fit_line`: ordinary least squares ``y = slope * x + intercept`` with its r².
- :func:`median_diff_test`: the difference of two samples' medians (B - A) with exact one-sided Mann-Whitney
  p-values, so "B is slower than A" is said only where the ranks show it.
- :func:`compare_requests`: two cells of per-request values (a request's value is its own median over its steps;
  steps of one request are never independent samples), the ratio of their medians B / A with a seeded percentile
  bootstrap interval over requests (each cell resampled on its own), and its verdict: "higher" (the interval above
  1), "lower" (below 1), "tie" (it holds 1), or "not enough requests" (fewer than :data:`MIN_REQUESTS` in a cell).
  A "no cost" reads its upper end: "no cost above (hi - 1)".
- :func:`against_target`: the same interval read against a target multiple (growth within 1.5x): "within" only where
  its upper end is at or below the target, "beyond" where its lower end is above it, else "spans".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

import numpy as np

MIN_REQUESTS = 3        #: requests per cell before a comparison states a verdict
BOOT_RESAMPLES = 2000   #: bootstrap resamples of each cell
LEVEL = 0.95            #: the interval's coverage
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
    """Cell B against cell A over requests: medians, their ratio B / A, its bootstrap interval and the verdict."""

    n_a: int                    #: requests in cell A
    n_b: int
    median_a: float | None      #: median over A's request values (the values' unit)
    median_b: float | None
    ratio: float | None         #: median_b / median_a
    lo: float | None            #: the interval's lower end (None: not enough requests)
    hi: float | None
    verdict: str                #: "higher", "lower", "tie" or "not enough requests"
    level: float = LEVEL

    @property
    def enough(self) -> bool:
        return self.verdict != NOT_ENOUGH

    def interval_text(self) -> str:
        """'1.02-1.10x' (or '' without an interval)."""
        return f"{self.lo:.3g}-{self.hi:.3g}x" if self.lo is not None and self.hi is not None else ""

    def counts_text(self) -> str:
        """'3 / 3 requests'."""
        return f"{self.n_a} / {self.n_b} requests"


def ratio_verdict(lo: float, hi: float) -> str:
    """"higher" (the interval above 1), "lower" (below 1) or "tie" (it holds 1)."""
    return "higher" if lo > 1.0 else "lower" if hi < 1.0 else "tie"


def compare_requests(a: Sequence[float], b: Sequence[float], seed: int = 0,
                     min_requests: int = MIN_REQUESTS) -> RequestComparison:
    """B against A over per-request values (module doc): the ratio of the medians with a percentile bootstrap
    interval (:data:`BOOT_RESAMPLES` resamples of each cell independently, numpy's default_rng(seed), :data:`LEVEL`);
    fewer than ``min_requests`` values in either cell, or a zero median in A: "not enough requests", no interval."""
    fa = [float(x) for x in a if x is not None and math.isfinite(float(x))]
    fb = [float(x) for x in b if x is not None and math.isfinite(float(x))]
    med_a = statistics.median(fa) if fa else None
    med_b = statistics.median(fb) if fb else None
    ratio = med_b / med_a if med_a and med_b is not None else None
    if len(fa) < min_requests or len(fb) < min_requests or not med_a:
        return RequestComparison(len(fa), len(fb), med_a, med_b, ratio, None, None, NOT_ENOUGH)
    rng = np.random.default_rng(seed)
    xa, xb = np.asarray(fa), np.asarray(fb)
    rb = np.median(xb[rng.integers(0, len(xb), (BOOT_RESAMPLES, len(xb)))], axis=1)  # B's resamples first
    ra = np.median(xa[rng.integers(0, len(xa), (BOOT_RESAMPLES, len(xa)))], axis=1)
    tail = (1.0 - LEVEL) / 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = rb / ra
    boot = boot[np.isfinite(boot)]
    lo, hi = (float(x) for x in np.quantile(boot, [tail, 1.0 - tail]))
    return RequestComparison(len(fa), len(fb), med_a, med_b, ratio, lo, hi, ratio_verdict(lo, hi))


def no_cost_above(c: RequestComparison) -> str:
    """An upper bound from the interval: 'no cost above +4.1%' (or '' without an interval)."""
    return f"no cost above {100 * (c.hi - 1):+.1f}%" if c.hi is not None else ""


def against_target(c: RequestComparison, target: float) -> str:
    """A ratio's interval read against a target multiple (e.g. 1.5x growth): "within" (the upper end at or below it),
    "beyond" (the lower end above it), "spans" (the interval holds it: neither is shown) or "not enough requests"."""
    if c.lo is None or c.hi is None:
        return NOT_ENOUGH
    return "within" if c.hi <= target else "beyond" if c.lo > target else "spans"
