"""specdiag.roofline (floors, FLOPs, effective bandwidth, slopes) and 05's verdicts on it
(specdiag.steps.bandwidth_analysis.verdicts), against hand arithmetic."""

from __future__ import annotations

import pytest

from specdiag import geometry as g
from specdiag import roofline as rl
from specdiag.hardware import HardwarePeaks, Peak
from specdiag.steps.bandwidth_analysis import verdicts

RTX_PRO = HardwarePeaks("RTX PRO 6000 Blackwell", Peak(1792e9, "parameter", "test"), Peak(503.8e12, "parameter", "t"))


def test_mla_verify_flops_absorbed() -> None:
    geom = g.load_geometry("kimi-k2")
    # 2 x local heads x draft tokens x L x (576 + 512) per layer, 61 layers; TP 8 -> 8 local heads.
    flops = rl.verify_attention_flops(geom, 185_000, draft_tokens=8, tp_size=8)
    assert flops == 2 * 8 * 8 * 185_000 * (576 + 512) * 61
    assert flops / 1e12 == pytest.approx(1.57, abs=0.005)  # h*s_q = 64


def test_gqa_verify_flops_window_capped() -> None:
    cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
           "hidden_size": 32, "vocab_size": 10, "layer_types": ["sliding_attention", "full_attention"],
           "sliding_window": 100}
    geom = g.from_hf_config(cfg)
    assert rl.verify_attention_flops(geom, 1000, 3) == 2 * 4 * 3 * (100 + 1000) * (8 + 8)


def test_floors_effective_bandwidth_and_percent_of_peak_at_185k() -> None:
    geom = g.load_geometry("kimi-k2.6")
    step = rl.step_roofline(geom, 185_000, RTX_PRO, tp_size=8, draft_tokens=8, measured_step_ms=1430)
    row = step.as_row()
    kv = 185_000 * 61 * 1152
    assert row["kv_gb_per_step"] == pytest.approx(kv / 1e9)
    assert row["kv_floor_ms"] == pytest.approx(1e3 * kv / 1792e9)             # 7.25 ms
    assert row["kv_floor_ms"] == pytest.approx(7.25, abs=0.01)
    assert row["effective_gb_s_kv"] == pytest.approx(kv / 1.430 / 1e9)        # 9.09 GB/s
    assert row["effective_gb_s_kv"] == pytest.approx(9.09, abs=0.01)
    assert row["pct_of_peak_kv"] == pytest.approx(100 * kv / 1.430 / 1792e9)  # 0.507 %
    total = kv + g.weight_bytes_per_step(geom, tp_size=8, tokens_per_step=8).total
    assert row["total_gb_per_step"] == pytest.approx(total / 1e9)
    assert row["memory_floor_ms"] == pytest.approx(1e3 * total / 1792e9)
    assert row["compute_floor_ms"] == pytest.approx(1e3 * 2 * 8 * 8 * 185_000 * 1088 * 61 / 503.8e12)
    assert row["floor_ms"] == pytest.approx(max(row["memory_floor_ms"], row["compute_floor_ms"]))
    assert row["measured_over_floor_x"] == pytest.approx(1430 / row["floor_ms"])
    assert row["efficiency_pct"] == pytest.approx(100 * row["floor_ms"] / 1430)


def test_compute_bound_when_heads_times_draft_tokens_large() -> None:
    geom = g.load_geometry("kimi-k2")
    # 16 local heads x 64 draft tokens (TP 4): compute floor above the KV floor (about 2 h T FLOP per KV byte).
    step = rl.step_roofline(geom, 128_000, RTX_PRO, tp_size=4, draft_tokens=64)
    assert step.compute_floor_s > step.kv_floor_s
    assert step.floor_s == step.compute_floor_s


def test_primitives_and_errors() -> None:
    assert rl.memory_floor_s(2e9, 1e12) == pytest.approx(2e-3)
    assert rl.compute_floor_s(1e12, 1e15) == pytest.approx(1e-3)
    assert rl.effective_bandwidth(13e9, 1.43) == pytest.approx(9.09e9, rel=1e-3)
    assert rl.efficiency(0.007, 1.43) == pytest.approx(0.007 / 1.43)
    with pytest.raises(ValueError):
        rl.effective_bandwidth(1, 0)
    with pytest.raises(ValueError):
        rl.memory_floor_s(1, 0)


def _steps(slope_ms_per_1k: float) -> list[rl.StepRoofline]:
    geom = g.load_geometry("kimi-k2")
    ctxs = [1_000, 32_000, 64_000, 128_000]
    return [rl.step_roofline(geom, c, RTX_PRO, tp_size=8, draft_tokens=8,
                             measured_step_ms=5.0 + slope_ms_per_1k * c / 1000) for c in ctxs]


def test_slope_comparison() -> None:
    cmp = rl.slope_comparison(_steps(7.7))
    assert cmp.measured.slope_per_1k == pytest.approx(7.7)
    # The floor grows by 1,000 x 61 x 1152 B per 1k tokens at 1,792 GB/s.
    assert cmp.floor.slope_per_1k == pytest.approx(1e3 * 1000 * 61 * 1152 / 1792e9)
    assert cmp.ratio == pytest.approx(7.7 / cmp.floor.slope_per_1k)
    with pytest.raises(ValueError, match="two or more"):
        rl.slope_comparison(_steps(1.0)[:1])


def test_findings_thresholds() -> None:
    far = {f.id: f for f in verdicts.bandwidth_findings(_steps(7.7), RTX_PRO, quoted_attention_gb_s=14)}
    assert far["bandwidth.far_from_floor"].severity == "critical"
    assert far["bandwidth.slope"].severity == "critical"
    assert far["bandwidth.compute_bound"].numbers["bound"] == "memory"
    att = far["bandwidth.attention_only"].numbers
    kv = 128_000 * 61 * 1152
    assert att["implied_attention_s"] == pytest.approx(kv / 14e9)
    # a quote the caller passed is labelled a parameter, one from a recorded run as the caller names it
    assert att["quoted_source"] == "parameter"
    assert "14 GB/s (parameter)" in far["bandwidth.attention_only"].evidence[1]
    pub = {f.id: f for f in verdicts.bandwidth_findings(_steps(7.7), RTX_PRO, quoted_attention_gb_s=14,
                                                  quoted_source="published (run.json)")}
    assert "14 GB/s (published (run.json))" in pub["bandwidth.attention_only"].evidence[1]
    # A step near its floor: measured = 1.5 x floor everywhere -> ok.
    geom = g.load_geometry("kimi-k2")
    near = []
    for c in (1_000, 64_000, 128_000):
        s = rl.step_roofline(geom, c, RTX_PRO, tp_size=8, draft_tokens=8)
        near.append(rl.step_roofline(geom, c, RTX_PRO, tp_size=8, draft_tokens=8, measured_step_ms=1.5e3 * s.floor_s))
    ok = {f.id: f for f in verdicts.bandwidth_findings(near, RTX_PRO)}
    assert ok["bandwidth.far_from_floor"].severity == "ok"
    assert ok["bandwidth.slope"].severity == "ok"
    # Thresholds are parameters.
    strict = {f.id: f for f in verdicts.bandwidth_findings(near, RTX_PRO, floor_ratio_threshold=1.2)}
    assert strict["bandwidth.far_from_floor"].severity == "critical"
    assert verdicts.bandwidth_findings([], RTX_PRO) == []
    # A step under its floor cannot be: a warning that names the peak to pass, not an ok.
    under = [rl.step_roofline(geom, c, RTX_PRO, tp_size=8, draft_tokens=8,
                              measured_step_ms=0.4e3 * rl.step_roofline(geom, c, RTX_PRO, tp_size=8, draft_tokens=8).floor_s)
             for c in (1_000, 128_000)]
    low = {f.id: f for f in verdicts.bandwidth_findings(under, RTX_PRO)}["bandwidth.far_from_floor"]
    assert low.severity == "warning" and "faster than the floor allows" in low.verdict
    assert "pass memory_bandwidth_gb_s" in low.verdict  # Kimi K2 at TP8 on that GPU is memory-bound


def test_endpoint_slopes() -> None:
    steps = _steps(7.7)
    measured, floor = rl.endpoint_slopes_ms_per_1k(steps)
    assert measured == pytest.approx(7.7)
    assert floor == pytest.approx(1e3 * (steps[-1].memory_floor_s - steps[0].memory_floor_s) / 127)
    with pytest.raises(ValueError):
        rl.endpoint_slopes_ms_per_1k(steps[:1])


def test_flat_excess_points_to_per_step_cost_and_negative_slope_is_ok() -> None:
    geom = g.load_geometry("kimi-k2")
    flat = [rl.step_roofline(geom, c, RTX_PRO, tp_size=8, draft_tokens=8, measured_step_ms=500.0 - c / 1e5)
            for c in (1_000, 64_000, 128_000)]
    f = {x.id: x for x in verdicts.bandwidth_findings(flat, RTX_PRO)}
    assert f["bandwidth.far_from_floor"].severity == "critical"
    assert "per-step cost" in f["bandwidth.far_from_floor"].verdict
    assert f["bandwidth.slope"].severity == "ok" and "does not grow" in f["bandwidth.slope"].verdict
    steep = {x.id: x for x in verdicts.bandwidth_findings(_steps(7.7), RTX_PRO)}
    assert "attention kernel" in steep["bandwidth.far_from_floor"].verdict
