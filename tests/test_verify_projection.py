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
    assert vp.main(["--stock", str(PROJECT_ROOT / "data/reference/sglang-h200-mla2-stock-traced"),
                    "--fixed", str(PROJECT_ROOT / "data/reference/sglang-h200-mla2-plugin-traced")]) == 0
    out = capsys.readouterr().out
    # measured 131,072-token steps (stock 55.82, plugin 2.38 ms) over 2 layers: 26.72 ms saved per layer
    assert "131,072 | 55.82 | 2.38 | 26.72" in out
    assert "extrapolated" in out


def test_compare_command_names_both_runs_or_says_how(capsys):
    from specdiag import report

    assert report.main(["compare", "--run-a", str(PROJECT_ROOT / "data/reference/sglang-h200-mla2-stock-traced")]) != 0
    assert "compare needs two run folders" in capsys.readouterr().err


# --- the traced projection (verify-attention kernel times from step_profile rows) -------------------------------------
def _rows(context: int, attention_ms: float, kv_indices_ms: float = 0.0, arm: str = "a", steps: int = 5,
          column: str = "gpu_attn_specdiag_splitkv_ms") -> list[dict]:
    """Synthetic step_profile rows of one trace: ``steps`` complete verify steps plus a partial last one."""
    rows = [{"context_tokens": context, "arm": arm, "step": i, "partial": False, "verify_step": True, "wall_ms": 9.0,
             column: attention_ms + 0.001 * (i - steps // 2), "gpu_kv_indices_ms": kv_indices_ms, "gpu_gemm_ms": 0.05}
            for i in range(steps)]
    rows.append({**rows[0], "step": steps, "partial": True, column: 1000.0, "note": "last step"})
    return rows


def test_two_profiled_contexts_give_a_line_one_gives_proportional_scaling():
    # fixed arm, 2 layers: per layer 0.03 ms fixed + 0.001 ms per 1k tokens -> per step 2 x (0.03 + 0.001 c/1k)
    fixed = _rows(1_000, 2 * (0.03 + 0.001)) + _rows(101_000, 2 * (0.03 + 0.101))
    stock = _rows(100_000, 2 * 20.0, column="gpu_attn_sglang_triton_ms")   # one context: 20 ms per layer
    tp = vp.project_traced(stock, fixed, layers_measured=2, layers_target=10, target_context=200_000)
    assert tp.fixed.method == "line" and tp.stock.method == "proportional"
    f = tp.fixed.attention_fit_per_layer
    assert f.fixed_ms == pytest.approx(0.03) and f.ms_per_1k_tokens == pytest.approx(0.001)
    assert tp.fixed.target_attention_ms_per_layer == pytest.approx(0.03 + 0.2)
    assert tp.fixed.target_attention_ms == pytest.approx(10 * 0.23)
    assert tp.stock.attention_fit_per_layer.fixed_ms == 0.0                 # proportional: no fixed cost
    assert tp.stock.target_attention_ms == pytest.approx(10 * 20.0 * 200_000 / 100_000)
    assert tp.target_saved_ms == pytest.approx(400.0 - 2.3)
    assert tp.stock.target_source == tp.fixed.target_source == "extrapolated"
    assert "upper bound" in tp.stock.method_note and "least-squares" in tp.fixed.method_note
    # medians over the complete verify steps: the partial step's 1000 ms is left out
    assert [c.steps for c in tp.fixed.contexts] == [5, 5]
    assert tp.fixed.contexts[0].attention_ms_per_step == pytest.approx(0.062)
    # a target inside the profiled range is interpolated; at the one profiled context it is that context's value
    inside = vp.project_traced(stock, fixed, layers_measured=2, layers_target=2, target_context=100_000)
    assert inside.fixed.target_source == "interpolated"
    assert inside.stock.target_source == "at a profiled context"
    assert inside.stock.target_attention_ms == pytest.approx(40.0)


def test_proportional_scaling_bounds_a_line_with_a_fixed_cost_from_above_past_its_context():
    a, b = 0.5, 0.01                                 # per layer: ms fixed, ms per 1k tokens
    true = lambda c: a + b * c / 1000                # noqa: E731
    one = vp.traced_arm("x", vp.traced_contexts(_rows(10_000, true(10_000)), layers_measured=1),
                        layers_target=1, target_context=50_000)
    assert one.method == "proportional"
    assert one.target_attention_ms > true(50_000)                                   # upper bound past c1
    assert one.target_attention_ms - true(50_000) == pytest.approx(a * (50_000 / 10_000 - 1), rel=1e-3)
    assert one.attention_fit_per_layer.at(2_000) < true(2_000)                       # lower bound below c1


def test_per_step_parts_are_reported_once_not_multiplied_by_layers():
    # the KV-index kernel: 0.001 ms per 1k tokens per STEP; attention excludes it
    fixed = _rows(1_000, 0.1, kv_indices_ms=0.001) + _rows(101_000, 0.3, kv_indices_ms=0.101)
    stock = _rows(101_000, 40.0, kv_indices_ms=0.101, column="gpu_attn_sglang_triton_ms")
    tp = vp.project_traced(stock, fixed, layers_measured=2, layers_target=61, target_context=201_000)
    assert tp.fixed.target_per_step_ms == pytest.approx(0.201)                       # not x 61, not / 2
    assert tp.stock.target_per_step_ms == pytest.approx(0.101 * 201_000 / 101_000)
    assert tp.fixed.contexts[1].attention_ms_per_step == pytest.approx(0.3)          # kv_indices not in the attention
    assert tp.fixed.contexts[1].per_step_ms == pytest.approx(0.101)


def test_the_attention_columns_are_every_attn_class_summed():
    row = _rows(1_000, 0.0)[:1]
    row[0].update(gpu_attn_sglang_triton_ms=1.0, gpu_attn_sglang_verify_splitkv_ms=0.5, gpu_attn_other_ms=0.25,
                  gpu_attn_specdiag_splitkv_ms=0.125)
    (c,) = vp.traced_contexts(row, layers_measured=1)
    assert c.attention_ms_per_step == pytest.approx(1.875)
    assert set(vp.ATTENTION_COLUMNS) == {"gpu_attn_specdiag_splitkv_ms", "gpu_attn_sglang_verify_splitkv_ms",
                                         "gpu_attn_sglang_triton_ms", "gpu_attn_other_ms"}


def test_missing_or_unusable_traces_say_what_to_do():
    with pytest.raises(vp.MissingTraces, match=r"stock-run: no step_profile rows.*specdiag\.telemetry\.torch_trace"):
        vp.project_traced([], _rows(1_000, 0.1), layers_measured=2, stock_run="stock-run")
    with pytest.raises(vp.MissingTraces, match="fixed-run"):
        vp.project_traced(_rows(1_000, 0.1), [], layers_measured=2, fixed_run="fixed-run")
    with pytest.raises(ValueError, match="no verify-attention kernel time"):
        vp.traced_contexts(_rows(1_000, 0.0), layers_measured=2)
    with pytest.raises(ValueError, match="several arms"):
        vp.traced_contexts(_rows(1_000, 0.1, arm="a") + _rows(2_000, 0.1, arm="b"), layers_measured=2)
    only_partial = [r for r in _rows(1_000, 0.1) if r["partial"]]
    with pytest.raises(ValueError, match="no complete verify step"):
        vp.traced_contexts(only_partial, layers_measured=2)


def test_the_two_methods_differ_by_what_else_grows_per_step():
    """Whole step = 2 layers x attention + a per-step part that grows 0.04 ms per 1k tokens (drafting on the CPU):
    the step-based growth counts it x layers, the traced one does not; their difference gives it back per step."""
    ctxs = [1_000, 51_000, 101_000]
    att_fixed = lambda c: 0.02 + 0.0005 * c / 1000     # noqa: E731 - ms per layer
    att_stock = lambda c: 0.2 * c / 1000               # noqa: E731
    other = lambda c: 2.0 + 0.04 * c / 1000            # noqa: E731 - ms per step
    step = vp.project_layers({c: 2 * att_stock(c) + other(c) for c in ctxs}, {c: 2 * att_fixed(c) + other(c) for c in ctxs},
                             layers_measured=2, layers_target=60, target_context=181_000)
    traced = vp.project_traced(sum((_rows(c, 2 * att_stock(c), column="gpu_attn_sglang_triton_ms") for c in ctxs), []),
                               sum((_rows(c, 2 * att_fixed(c)) for c in ctxs), []),
                               layers_measured=2, layers_target=60, target_context=181_000)
    d_stock, d_fixed = vp.compare_methods(step, traced)
    assert d_fixed.traced_growth_ms == pytest.approx(60 * 0.0005 * 180, rel=1e-3)
    for d in (d_stock, d_fixed):
        assert d.other_growth_per_step_ms == pytest.approx(0.04 * 180, rel=1e-3)   # the per-step part's growth
        assert d.other_growth_ms == pytest.approx(0.04 * 180 * 60 / 2, rel=1e-3)
    with pytest.raises(ValueError, match="differ in target"):
        vp.compare_methods(step, vp.project_traced(_rows(1_000, 1.0), _rows(1_000, 0.1), layers_measured=2))


def test_layers_of_reads_run_json_or_says_it_is_missing():
    assert vp.layers_of({"model": {"model_config": {"num_hidden_layers": 2}}}) == 2
    with pytest.raises(ValueError, match="num_hidden_layers"):
        vp.layers_of({"model": {}}, "x/run.json")


def test_cli_traced_on_the_traced_arms(capsys):
    assert vp.main(["--stock", str(PROJECT_ROOT / "data/reference/sglang-h200-mla2-stock-traced"),
                    "--fixed", str(PROJECT_ROOT / "data/reference/sglang-h200-mla2-plugin-traced"), "--traced"]) == 0
    out = capsys.readouterr().out
    # traced, measured: stock _fwd_kernel 50.285 ms per step at 131,072; plugin split-KV 0.064 (1,024), 0.262 (131,072)
    assert "stock | 131,072 | measured (trace, 11 steps) | 50.285 | 25.1425 | 2 | 0.140" in out
    assert "fixed | 1,024 | measured (trace, 11 steps) | 0.064 |" in out
    assert "stock | 185,000 | extrapolated (proportional) | 2164.7" in out
    assert "fixed | 185,000 | extrapolated (line) | 10.479 |" in out


def test_cli_traced_without_traces_names_the_run(capsys):
    ref = PROJECT_ROOT / "data/reference"
    assert vp.main(["--stock", str(ref / "sglang-h200-mla2-stock-185k"),
                    "--fixed", str(ref / "sglang-h200-mla2-plugin-check-bf16"), "--traced"]) == 2
    err = capsys.readouterr().err
    assert "no traced projection: sglang-h200-mla2-stock-185k: no step_profile rows" in err


def test_a_run_at_the_investigations_depth_is_used_as_measured_not_scaled():
    # the Triton steps at 61 layers: a line through 1k, 64k, 128k taken to 185k, nothing multiplied
    ms = {1024: 19.7, 65536: 841.0, 131072: 1657.0}
    d = vp.project_to_investigation(ms, layers_measured=61, layers_target=61, target_context=185_000, published_ms=1430,
                                    measured_peak_gb_s=4800, investigation_peak_gb_s=1792, run="r", arm="triton")
    fit = vp.fit_context(sorted(ms.items()))
    assert d.method == "measured at depth" and d.scale == 1.0 and d.target_source == "extrapolated"
    assert d.projected_ms == pytest.approx(fit.at(185_000))
    # the investigation's GPU: the same time (latency-bound) to x 4800 / 1792 (bandwidth-bound)
    assert d.range_ms == pytest.approx((d.projected_ms, d.projected_ms * 4800 / 1792))
    assert d.published_over_projected == pytest.approx((1430 / d.range_ms[0], 1430 / d.range_ms[1]))
    assert d.within is False  # 1,430 ms lies below the range
    inside = vp.project_to_investigation(ms, layers_measured=61, published_ms=3000, measured_peak_gb_s=4800,
                                         investigation_peak_gb_s=1792)
    assert inside.within is True
    # a 2-layer run is scaled, and says so
    two = vp.project_to_investigation({1024: 2.39, 131072: 55.82}, layers_measured=2, target_context=131072)
    assert two.method == "scaled from 2 layers (x30.5)" and two.projected_ms == pytest.approx(55.82 * 30.5)
    assert two.range_ms is None and two.within is None and two.target_source == "interpolated"
    with pytest.raises(ValueError, match="a line needs two or more"):
        vp.project_to_investigation({1024: 2.0}, layers_measured=2, run="one", arm="triton")


def test_an_arms_steps_come_from_engine_ab_decode_rows_else_the_sweep():
    rows = [{"arm": a, "phase": "decode", "context_tokens": c, "repeat": r, "ts_unix_s": 10.0 * i, "e2e_s": 1.0,
             "step_ms": v + r, "ttft_s": 0.1, "error": None, "commit_length": 1.0, "decode_tok_s": 1.0,
             "cached_tokens": c - 1, "concurrent": 1}
            for i, (a, c, r, v) in enumerate([("triton", 1024, 0, 19.0), ("triton", 1024, 1, 19.0), ("triton", 1024, 2, 19.0),
                                              ("triton", 65536, 0, 840.0), ("plugin", 1024, 0, 6.0)])]
    assert vp.arm_steps({}, rows, [], "triton") == {1024: 20.0, 65536: 840.0}
    assert vp.arm_steps({}, [], [{"context_tokens": 1024, "step_ms": 3.0, "error": None}], "triton") == {1024: 3.0}
    assert vp.recorded_peak_gb_s({"device": {"gpu": "NVIDIA H200"}})[0] == 4800
    assert vp.recorded_peak_gb_s({"hardware": {"memory_bandwidth_gb_s": 4814.3, "device_name": "NVIDIA H200"}}) == (
        4814.3, "recorded (NVIDIA H200)")
    assert vp.recorded_peak_gb_s({}) is None and vp.recorded_peak_gb_s({}, "NVIDIA H200")[0] == 4800
