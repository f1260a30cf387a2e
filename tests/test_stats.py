"""The one quantile and the one least-squares line every module summarizes with."""

from __future__ import annotations

import numpy as np
import pytest

from specdiag import stats
from specdiag.speculation import commit
from specdiag.steps.gpu_utilization import analysis as utilization
from specdiag.steps.kernel_ab.timing import summarize_ms


@pytest.mark.parametrize("q", [0.0, 0.1, 0.25, 0.5, 0.9, 1.0])
def test_quantile_is_numpy_linear(q: float) -> None:
    vals = [7.0, 1.0, 3.0, 3.0, 10.0, 2.5, 8.25]
    assert stats.quantile(vals, q) == pytest.approx(float(np.quantile(vals, q)))


def test_every_summary_uses_the_one_quantile() -> None:
    samples = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    s = summarize_ms(samples)  # kernel timings: was nearest rank (p10 1.0, p90 9.0)
    assert (s["ms_p10"], s["ms_median"], s["ms_p90"]) == pytest.approx((1.9, 5.5, 9.1))
    c = commit.step_commit_stats([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert (c.p10, c.p90) == pytest.approx((1.9, 9.1))
    assert utilization.quantile is stats.quantile
    with pytest.raises(ValueError, match="empty"):
        stats.quantile([], 0.5)


def test_fit_line_and_the_kernel_fixed_cost_fit_agree() -> None:
    import pandas as pd

    from specdiag.steps.baseline_sweep import summary
    from specdiag.steps.kernel_ab import analysis

    assert summary.fit_line is stats.fit_line
    fit = stats.fit_line([0, 1, 2, 3], [1.0, 3.0, 5.0, 7.0])
    assert (fit.slope, fit.intercept, fit.r2, fit.n) == pytest.approx((2.0, 1.0, 1.0, 4))
    # kernel fit: ms = 20 us + bytes / 2,000 GB/s over three contexts
    rows = pd.DataFrame([{"arm": "pick", "layout": "shuffled_p1", "heads": 8, "draft_tokens": 1,
                          "context_tokens": c, "kv_bytes": c * 1152, "ms_median": 1e3 * (20e-6 + c * 1152 / 2e12)}
                         for c in (8192, 65536, 131072)])
    (row,) = analysis.fixed_cost_fit(rows).to_dict("records")
    assert row["fixed_us"] == pytest.approx(20.0) and row["marginal_gbps"] == pytest.approx(2000.0)


def test_kernel_peaks_come_from_the_hardware_measurement(monkeypatch) -> None:
    """One copy and one matmul measurement in the project: the kernel A/B records hardware's, as medians."""
    import torch

    from specdiag import hardware
    from specdiag.steps.kernel_ab.harness import measure_peaks

    monkeypatch.setattr(hardware, "measure_copy_bandwidth", lambda device, n_bytes, repeats, warmup: [4e12, 2e12, 4e12])
    monkeypatch.setattr(hardware, "measure_matmul_rate", lambda device, n, repeats, warmup: [8e14] * 3)
    out = measure_peaks(torch.device("cuda"))
    assert out["copy_gbps"] == pytest.approx(4000.0) and out["matmul_tflops"] == pytest.approx(800.0)
    assert measure_peaks(torch.device("cpu"))["copy_gbps"] is None


def test_median_diff_test_exact_mann_whitney() -> None:
    from math import comb  # noqa: PLC0415

    # every ordering counted once: the U distribution of m A's and n B's sums to C(m + n, m)
    assert sum(stats._u_counts(5, 5)) == comb(10, 5) and sum(stats._u_counts(3, 7)) == comb(10, 3)
    a = [2.0, 2.1, 2.2, 2.3, 2.4]
    b = [3.0, 3.1, 3.2, 3.3, 3.4]  # every B above every A: the most extreme of 252 orderings
    t = stats.median_diff_test(a, b)
    assert t.diff == pytest.approx(1.0) and t.p_higher == pytest.approx(1 / 252) and t.p_lower == 1.0
    assert t.verdict == "higher" and stats.median_diff_test(b, a).verdict == "lower"
    # interleaved samples: nothing to say; the two one-sided p-values overlap at the observed U
    mixed = stats.median_diff_test([1.0, 3.0, 5.0, 7.0], [2.0, 4.0, 6.0, 8.0])
    assert mixed.verdict == "indistinguishable" and mixed.p_higher + mixed.p_lower > 1.0
    # a tie counts one half: identical samples sit at the centre of the distribution
    same = stats.median_diff_test([1.0, 1.0, 2.0], [1.0, 1.0, 2.0])
    assert same.diff == 0.0 and same.verdict == "indistinguishable"
    with pytest.raises(ValueError, match="2 or more values"):
        stats.median_diff_test([1.0], [1.0, 2.0])


def test_compare_requests_verdicts() -> None:
    """Per-request values: 2 in a cell say "not enough requests"; overlapping cells a tie; separated ones a
    difference with an interval that excludes 1; the interval draws nothing (same call, same numbers)."""
    few = stats.compare_requests([10.0, 10.2], [12.0, 12.1, 12.2])
    assert few.verdict == "not enough requests" and few.lo is None and (few.n_a, few.n_b) == (2, 3)
    assert few.ratio == pytest.approx(12.1 / 10.1)
    tie = stats.compare_requests([10.0, 11.0, 12.0], [10.5, 11.5, 12.5])
    assert tie.verdict == "tie" and tie.lo <= 1.0 <= tie.hi and tie.enough
    slower = stats.compare_requests([10.0, 10.1, 10.2], [12.0, 12.1, 12.2])
    assert slower.verdict == "higher" and 1.0 < slower.lo <= slower.ratio <= slower.hi
    assert slower.ratio == pytest.approx(12.1 / 10.1) and slower.interval_text().endswith("x")
    assert stats.compare_requests([12.0, 12.1, 12.2], [10.0, 10.1, 10.2]).verdict == "lower"
    assert stats.compare_requests([10.0, 10.1, 10.2], [12.0, 12.1, 12.2]) == slower  # exact: nothing drawn
    assert stats.no_cost_above(tie).startswith("no cost above +") and stats.no_cost_above(few) == ""
    assert slower.named_interval() == "90% interval 1.18-1.22x" and few.named_interval() == ""


def test_the_interval_is_named_for_the_level_it_has() -> None:
    """3 against 3 requests: the interval is the range of the request ratios, [min B / max A, max B / min A], and its
    level 90%: of the 20 equally likely ways 6 distinct requests of one configuration fall into two cells of 3, exactly
    2 (1 in 10) give a verdict other than a tie. More requests reach the aimed 95%."""
    import itertools

    c = stats.compare_requests([10.0, 11.0, 12.5], [13.0, 14.0, 15.5])
    assert (c.lo, c.hi) == (pytest.approx(13.0 / 12.5), pytest.approx(15.5 / 10.0)) and c.level == pytest.approx(0.9)
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    verdicts = [stats.compare_requests([values[i] for i in a], [values[i] for i in range(6) if i not in a]).verdict
                for a in itertools.combinations(range(6), 3)]
    assert len(verdicts) == 20 and sum(v != "tie" for v in verdicts) == 2
    assert stats.ratio_interval([1.0] * 3, [1.0] * 4)[2] == pytest.approx(1 - 2 / 35)  # 3 against 4: 94.3%
    lo, hi, level = stats.ratio_interval([1.0, 2.0, 3.0, 4.0, 5.0], [6.0, 7.0, 8.0, 9.0, 10.0])
    assert level == pytest.approx(1 - 2 * 4 / 252) and (lo, hi) == (6 / 4, 8 / 1)  # the 3rd smallest and largest of 25
    assert stats.level_text(0.9) == "90%" and stats.level_text(0.9683) == "96%"  # rounded down, never up
    assert stats.ratio_interval(list(range(1, 51)), list(range(2, 52)))[2] >= 0.95  # the normal approximation


def test_against_target_reads_the_interval() -> None:
    from specdiag.stats import against_target, compare_requests

    assert against_target(compare_requests([10.0, 10.1, 9.9], [11.0, 11.1, 10.9]), 1.5) == "within"
    assert against_target(compare_requests([10.0, 10.1, 9.9], [20.0, 20.1, 19.9]), 1.5) == "beyond"
    assert against_target(compare_requests([10.0, 10.0, 10.0], [12.0, 16.0, 20.0]), 1.5) == "spans"
    assert against_target(compare_requests([10.0, 10.1], [20.0, 20.1]), 1.5) == "not enough requests"
