"""Unit tests of specdiag.steps.bandwidth_analysis.verify_projection on synthetic step times (no I/O), and its CLI on the committed arms."""

import pytest

from specdiag.paths import PROJECT_ROOT

from specdiag.steps.bandwidth_analysis import verify_projection as vp


def test_saved_and_growth_per_layer_scale_to_target_layers():
    stock = {1000: 3.0, 11000: 23.0, 21000: 43.0}   # 2 layers: 1 ms per 1k tokens per layer
    fixed = {1000: 2.0, 11000: 4.0, 21000: 6.0}     # 0.1 ms per 1k tokens per layer
    pr = vp.project_layers(stock, fixed, layers_measured=2, layers_target=10, target_context=41000)
    r = pr.rows[-1]
    assert r.saved_per_layer_ms == pytest.approx((43.0 - 6.0) / 2)
    assert r.stock_growth_per_layer_ms == pytest.approx(20.0)
    assert r.fixed_growth_per_layer_ms == pytest.approx(2.0)
    assert r.projected_saved_ms == pytest.approx(185.0)
    assert pr.stock_slope_ms_per_1k_per_layer == pytest.approx(1.0)
    assert pr.fixed_slope_ms_per_1k_per_layer == pytest.approx(0.1)
    assert pr.target_stock_growth_ms == pytest.approx(10 * 1.0 * 40.0)
    assert pr.target_saved_ms == pytest.approx(10 * 0.9 * 40.0)
    assert pr.extrapolated and pr.base_context == 1000


def test_only_common_contexts_count_and_errors_are_clear():
    pr = vp.project_layers({1: 1.0, 2: 2.0, 3: 9.0}, {2: 1.0, 3: 1.5, 4: 7.0}, layers_measured=1, target_context=3)
    assert [r.context_tokens for r in pr.rows] == [2, 3] and not pr.extrapolated
    with pytest.raises(ValueError, match="two contexts"):
        vp.project_layers({1: 1.0}, {1: 1.0}, layers_measured=2)
    with pytest.raises(ValueError, match="layer counts"):
        vp.project_layers({1: 1.0, 2: 2.0}, {1: 1.0, 2: 2.0}, layers_measured=0)


def test_step_ms_by_context_takes_the_median_and_skips_errors():
    rows = [{"context_tokens": 8, "step_ms": 1.0}, {"context_tokens": 8, "step_ms": 3.0},
            {"context_tokens": 8, "step_ms": 100.0, "error": "timeout"}, {"context_tokens": 9, "step_ms": None}]
    assert vp.step_ms_by_context(rows) == {8: 2.0}


def test_cli_on_the_committed_h200_arms(capsys):
    assert vp.main(["--stock", str(PROJECT_ROOT / "data/reference/h200-sglang-mla-stock"),
                    "--fixed", str(PROJECT_ROOT / "data/reference/h200-sglang-mla-plugin-splitkv")]) == 0
    out = capsys.readouterr().out
    # measured 131,072-token steps (stock 54.26, plugin 8.65 ms) over 2 layers: 22.81 ms saved per layer
    assert "131,072 | 54.26 | 8.65 | 22.81" in out
    assert "extrapolated" in out


def test_compare_command_names_both_runs_or_says_how(capsys):
    from specdiag import report

    assert report.main(["compare", "--run-a", str(PROJECT_ROOT / "data/reference/h200-sglang-mla-stock")]) != 0
    assert "compare needs two run folders" in capsys.readouterr().err
