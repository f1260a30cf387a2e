"""drafter.window_check_finding: the verdict on a recorded drafter_window_check table (the drafter_timing measurement's window check)."""

from __future__ import annotations

from specdiag.steps.drafter_inspection import analysis as drafter


def _row(ctx, kind, shipped, full, correct=(5, 5), error=None):
    return {"context_tokens": ctx, "kind": kind, "window_tokens": 512, "beyond_window": ctx > 512,
            "verify_ct_as_shipped": shipped, "verify_ct_all_full": full, "correct_drafts_as_shipped": correct[0],
            "correct_drafts_all_full": correct[1], "same_drafting": None if error else (shipped, correct[0]) == (full, correct[1]),
            "error": error}


def test_identical_drafting_beyond_the_window_means_ignored():
    rows = [_row(384, "novel", 12, 12), _row(4096, "novel", 30, 30), _row(16000, "predictable", 12, 12),
            _row(16000, "novel", 28, 28)]
    f = drafter.window_check_finding(rows)
    assert f.id == "drafter.window_honoured" and f.severity == "warning"
    assert "ignores" in f.title and f.numbers["verdict"] == "ignored"
    assert f.numbers["rows_beyond_window"] == 3 and f.numbers["rows_differing_beyond_window"] == 0
    assert any("4,096 tokens" in e for e in f.evidence)


def test_a_difference_beyond_the_window_means_honoured():
    rows = [_row(384, "novel", 12, 12), _row(1024, "novel", 8, 7, (7, 8)), _row(1024, "predictable", 3, 3),
            _row(4096, "novel", 20, 20)]
    f = drafter.window_check_finding(rows, source="measured")
    assert f.severity == "ok" and "honours" in f.title and f.numbers["verdict"] == "honoured"
    assert f.numbers["rows_differing_beyond_window"] == 1


def test_two_requests_beyond_the_window_are_not_enough():
    rows = [_row(384, "novel", 12, 12), _row(4096, "novel", 30, 30), _row(16000, "predictable", 12, 12)]
    f = drafter.window_check_finding(rows)
    assert f.severity == "info" and "not enough requests" in f.verdict and f.numbers["verdict"] == "not enough requests"
    from specdiag import geometry

    geom = geometry.load_geometry("investigation-drafter")
    assert drafter.as_engine_ran(geom, f) is geom  # no verdict: the drafter as configured


def test_no_verdict_without_comparable_rows_beyond_the_window():
    assert drafter.window_check_finding([]) is None
    assert drafter.window_check_finding([_row(384, "novel", 12, 12)]) is None
    assert drafter.window_check_finding([_row(4096, "novel", None, None, error="HTTP 500")]) is None


def test_a_difference_inside_the_window_is_flagged_as_noise():
    rows = [_row(384, "novel", 12, 11, (3, 4)), _row(4096, "novel", 30, 30)]
    f = drafter.window_check_finding(rows)
    assert any("noisy" in e for e in f.evidence)
