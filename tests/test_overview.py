"""Unit tests of specdiag.steps.findings.overview (07_findings and 08_compare_runs helpers) on synthetic results."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdiag.steps.findings import overview
from specdiag.runs import Run


def finding(fid: str, severity: str, verdict: str = "v") -> dict:
    return {"id": fid, "title": fid, "verdict": verdict, "severity": severity, "evidence": [], "numbers": {},
            "source": "measured"}


RESULTS = {
    "00_snapshot": {"findings": [finding("snapshot.speculation", "info")], "metrics": {}},
    "01_baseline_sweep": {"findings": [finding("sweep.step_time_slope", "warning"),
                                       finding("sweep.decode_collapse", "critical", "falls 169x")], "metrics": {}},
    "07_findings": {"findings": [finding("findings.overall", "critical")], "metrics": {}},
}


def test_collect_and_overview_skip_summary_notebooks_and_sort_by_severity() -> None:
    found = overview.collect_findings(RESULTS)
    assert [f["id"] for f in found] == ["sweep.decode_collapse", "sweep.step_time_slope", "snapshot.speculation"]
    assert found[0]["notebook"] == "01_baseline_sweep"
    rows = {r["notebook"]: r for r in overview.notebook_overview(RESULTS, {"01_baseline_sweep": "ok"})}
    assert "07_findings" not in rows and rows["02_gpu_utilization"]["result"] == "none"
    assert rows["01_baseline_sweep"]["critical"] == 1 and rows["01_baseline_sweep"]["warning"] == 1
    assert rows["01_baseline_sweep"]["most severe"] == "[critical] falls 169x"
    assert rows["01_baseline_sweep"]["status"] == "ok"
    summary = overview.overall_finding(found, list(rows.values()))
    assert summary.severity == "critical" and summary.numbers["critical_findings"] == 1
    assert "02_gpu_utilization" in summary.numbers["missing"]
    empty = overview.overall_finding([], overview.notebook_overview({}))
    assert empty.severity == "warning" and "No notebook" in empty.verdict


def sweep_rows(decode: dict[int, float], step: dict[int, float], commit: float = 2.0) -> list[dict]:
    return [{"context_tokens": c, "repeat": 0, "prompt_kind": "novel", "seed": 0, "max_new_tokens": 9,
             "decode_tok_s": decode[c], "step_ms": step[c], "completion_tokens": 9, "verify_steps": int(8 / commit),
             "ttft_s": 0.1, "error": None} for c in decode]


def test_compare_sweeps_slopes_and_findings(tmp_path: Path) -> None:
    a = sweep_rows({1000: 100.0, 2000: 50.0, 4000: 25.0}, {1000: 10.0, 2000: 20.0, 4000: 40.0})
    b = sweep_rows({2000: 100.0, 4000: 75.0, 8000: 50.0}, {2000: 10.0, 4000: 13.0, 8000: 20.0}, commit=4.0)
    cmp = overview.compare_sweeps(a, b)
    assert [r["context_tokens"] for r in cmp] == [2000, 4000]
    assert cmp[1]["decode_tok_s_ratio_b_a"] == pytest.approx(3.0) and cmp[1]["step_ms_ratio_b_a"] == pytest.approx(13 / 40)
    assert cmp[0]["commit_length_a"] == pytest.approx(2.0) and cmp[0]["commit_length_b"] == pytest.approx(4.0)
    sa, sb = overview.step_slope(a), overview.step_slope(b)
    assert sa == pytest.approx(10.0) and sb == pytest.approx(1000 * 10 / 6000, rel=0.05)
    fc = overview.compare_findings(RESULTS, {"01_baseline_sweep": {"findings": [finding("sweep.decode_collapse", "ok")]}})
    changed = {f["id"]: f for f in fc if f["changed"]}
    assert set(changed) == {"sweep.decode_collapse", "sweep.step_time_slope", "snapshot.speculation"}
    assert changed["sweep.decode_collapse"]["severity_b"] == "ok"
    found = {f.id: f for f in overview.comparison_findings(cmp, sa, sb, fc)}
    assert found["compare.decode_speed"].numbers["decode_ratio_b_a_last"] == pytest.approx(3.0)
    # one request a context: the ratio is shown, no verdict drawn from it
    assert found["compare.decode_speed"].severity == "info" and "not enough requests" in found["compare.decode_speed"].verdict
    assert found["compare.decode_speed"].numbers["decode_ratio_b_a_geomean"] == pytest.approx((2.0 * 3.0) ** 0.5)
    assert "compare.step_time_test" not in found
    assert found["compare.verdicts"].numbers == {"changed": 3, "findings": 3}


def test_sweep_rows_follow_replay_of(tmp_path: Path) -> None:
    src = Run.create(tmp_path / "src", data_source="published")
    src.append_row("sweep", {"context_tokens": 1400, "repeat": 0, "decode_tok_s": 118.6, "error": None})
    replay = Run.create(tmp_path / "replay", replay_of=str(src.path))
    rows, where, source = overview.sweep_rows_of(replay)
    assert len(rows) == 1 and where == str(src.path) and source == "published"
    assert overview.sweep_rows_of(Run.create(tmp_path / "empty"))[0] == []


def test_commit_by_kind() -> None:
    rows = [{"prompt_kind": "predictable", "context_tokens": 1024, "completion_tokens": 65, "verify_steps": 8},
            {"prompt_kind": "predictable", "context_tokens": 1024, "completion_tokens": 33, "verify_steps": 8},
            {"prompt_kind": "novel", "context_tokens": 1024, "completion_tokens": 9, "verify_steps": 8},
            {"prompt_kind": "novel", "context_tokens": 2048, "error": "timeout"},
            {"kind": "predictable", "context_tokens": 16000, "commit_length": 7.0}]  # a published probe row
    assert overview.commit_by_kind(rows) == {("novel", 1024): 1.0, ("predictable", 1024): pytest.approx(6.0),
                                             ("predictable", 16000): 7.0}


# ---------------------------------------------------------------------------------------------
# Recorded runs and the diagnosis (07)
# ---------------------------------------------------------------------------------------------

def test_a_recorded_runs_results_are_split_off(tmp_path: Path) -> None:
    """06 on a CPU shows a recorded H200 kernel run: its result says so (recorded_from, or run.json's replays for a
    result written before the contract); in a whole-run replay every notebook's result is the run's own."""
    run = Run.create(tmp_path / "live", server_url="http://127.0.0.1:1")
    run.write_result("01_baseline_sweep", [finding("sweep.decode_collapse", "critical")])
    path = run.write_result("06_kernel_ab", [finding("kernel_ab.baseline_starves", "critical")],
                            recorded_from="data/reference/kernel-ab-h200")
    assert '"recorded_from": "data/reference/kernel-ab-h200"' in path.read_text()
    own, recorded = overview.split_recorded(run.results(), run.meta)
    assert set(own) == {"01_baseline_sweep"} and recorded == {"06_kernel_ab": "data/reference/kernel-ab-h200"}
    assert [f["id"] for f in overview.collect_findings(own)] == ["sweep.decode_collapse"]
    old = {"06_kernel_ab": {"findings": [finding("kernel_ab.baseline_starves", "critical")]}}
    meta = {"server_url": "http://x", "replays": {"06_kernel_ab": "data/reference/kernel-ab-h200"}}
    assert overview.split_recorded(old, meta)[1] == {"06_kernel_ab": "data/reference/kernel-ab-h200"}
    whole = {"replay_of": "data/reference/x", "replays": {"01_baseline_sweep": "data/reference/x"}}
    assert overview.split_recorded({"01_baseline_sweep": {}}, whole)[1] == {}
    rows = {r["notebook"]: r for r in overview.notebook_overview(run.results(), recorded=recorded)}
    assert rows["06_kernel_ab"]["result"] == "recorded run data/reference/kernel-ab-h200"
    assert rows["06_kernel_ab"]["critical"] is None and rows["06_kernel_ab"]["most severe"] == ""
    summary = overview.overall_finding(overview.collect_findings(own), list(rows.values()))
    assert summary.numbers["critical_findings"] == 1 and summary.numbers["recorded"] == recorded
    with pytest.raises(ValueError, match="recorded_from"):
        run.write_result("06_kernel_ab", [], recorded_from="")


def _f(fid: str, severity: str, notebook: str, **numbers) -> dict:
    return {**finding(fid, severity), "notebook": notebook, "numbers": numbers}


SWEEP = [_f("sweep.decode_collapse", "critical", "01_baseline_sweep", decode_collapse_x=41.2, decode_tok_s_first=82.4,
            decode_tok_s_last=2.0, context_tokens_first=1024, context_tokens_last=185000),
         _f("sweep.step_time_slope", "warning", "01_baseline_sweep", step_ms_first=9.5, step_ms_last=1430.0,
            context_tokens_first=1024, context_tokens_last=185000)]
FLOOR = [_f("bandwidth.far_from_floor", "critical", "05_bandwidth_analysis", context_tokens=185000, measured_ms=1430.0,
            floor_ms=12.34, measured_over_floor_x=115.9, pct_of_peak_total=0.86, peak_gb_s=4800.0),
         _f("bandwidth.slope", "critical", "05_bandwidth_analysis", measured_slope_ms_per_1k_tokens=7.7,
            floor_slope_ms_per_1k_tokens=0.05, slope_ratio_x=154.0)]


def test_a_step_or_prefill_under_its_floor_draws_no_floor_verdict() -> None:
    # A CPU's bf16 matmul rate (0.9 GFLOPS) once made the embedded server's floors 570 ms and 680 s against a measured
    # 210 ms step and a 20 s prefill; the diagnosis called prefill "near its floor". Under a floor, a peak is too low.
    from specdiag.steps.findings.diagnosis import diagnose

    under = [_f("bandwidth.far_from_floor", "warning", "05_bandwidth_analysis", context_tokens=16000, measured_ms=210.5,
                floor_ms=570.2, measured_over_floor_x=0.369, compute_floor_ms=570.2, memory_floor_ms=3.68),
             _f("bandwidth.prefill_floor", "warning", "05_bandwidth_analysis", context_tokens=16000, ttft_s=20.0,
                floor_s=680.0, ttft_over_floor_x=0.0294)]
    d = diagnose(SWEEP + under)
    assert "under the floor of 570 ms" in d.floor and "no floor verdict" in d.floor and "x its" not in d.floor
    assert "under its floor of 680 s" in d.paragraph and "near its floor" not in d.paragraph
    assert d.numbers["prefill_ttft_over_floor_x"] == 0.0294
    fine = [{**under[0], "numbers": {**under[0]["numbers"], "measured_ms": 2000.0, "measured_over_floor_x": 3.5}}]
    assert "3.5x its compute floor of 570 ms" in diagnose(SWEEP + fine).floor


def test_the_diagnosis_says_what_is_slow_how_far_from_the_floor_the_cause_and_the_fix_from_the_numbers() -> None:
    from specdiag.steps.findings.diagnosis import diagnose

    d = diagnose(SWEEP + FLOOR)
    assert d.slow.startswith("Decode falls 41.2x with context, from 82.4 tokens/s at 1k tokens to 2 at 185k tokens")
    assert "1,430 ms" in d.slow and "116x its memory floor of 12.3 ms" in d.floor and "0.86% of the 4,800 GB/s" in d.floor
    assert "attention over the KV cache" in d.cause and "7.7 ms" in d.cause and "154x" in d.cause
    assert d.fix.startswith("No fix was measured in this run") and "split" in d.fix  # a pointer, not a result
    assert d.severity == "critical" and d.numbers["slope_ratio_x"] == 154.0 and d.numbers["cause"] == "bandwidth.slope"
    assert d.based_on[0] == "01_baseline_sweep: sweep.decode_collapse"
    assert d.paragraph.index("Decode falls") < d.paragraph.index("floor") < d.paragraph.index("cause")
    # other numbers, other words: nothing in the paragraph is fixed prose
    other = diagnose([{**SWEEP[0], "numbers": {**SWEEP[0]["numbers"], "decode_collapse_x": 3.5, "decode_tok_s_last": 23.5}}])
    assert "3.5x" in other.slow and "23.5" in other.slow and "41.2" not in other.paragraph
    # a fix measured in the run is stated with its effect
    fixed = diagnose(SWEEP + FLOOR + [_f("kernel_ab.split_kv_speedup", "ok", "06_kernel_ab", fix="the split-KV kernel",
                                          fix_speedup_x=9.87, fix_context_tokens=131072)])
    assert "The fix measured in this run, the split-KV kernel, makes it 9.87x faster at 128k tokens" in fixed.fix
    # a flat slope with a step far from its floor: a per-step cost, not the attention
    flat = [FLOOR[0], {**FLOOR[1], "severity": "ok", "numbers": {**FLOOR[1]["numbers"], "slope_ratio_x": 1.3}}]
    assert "per-step cost that does not grow with context" in diagnose(flat).cause


def test_a_drafter_that_commits_nothing_is_the_cause_before_a_per_step_cost_but_not_before_the_attention() -> None:
    """The live H200 report of the 61-layer twin with a random DFLASH drafter: 1 token a step on both texts (04), the
    step 3.97x its floor with a flat slope (05). The drafter leads; a critical attention slope still outranks it."""
    from specdiag.steps.findings.diagnosis import diagnose

    silent = _f("probe.drafter_does_not_commit", "warning", "04_commit_probe", commit_length_max=1.0,
                max_commit_length=8)
    flat = [{**FLOOR[0], "severity": "warning"},
            {**FLOOR[1], "severity": "ok", "numbers": {**FLOOR[1]["numbers"], "slope_ratio_x": 1.71}}]
    d = diagnose(SWEEP + flat + [silent])
    assert d.cause.startswith("The most likely cause is a drafter that commits nothing: about 1 token per verify step "
                              "of at most 8") and "also a per-step cost" in d.cause
    assert d.numbers["cause"] == "probe.drafter_does_not_commit" and "a drafter trained for this target" in d.fix
    assert diagnose(SWEEP + FLOOR + [silent]).numbers["cause"] == "bandwidth.slope"


def test_the_diagnosis_falls_back_when_a_step_did_not_run() -> None:
    from specdiag.steps.findings.diagnosis import diagnose

    empty = diagnose([])
    assert "measured no decode speed" in empty.slow and "No memory floor" in empty.floor
    assert "No finding of this run points at a cause" in empty.cause and empty.fix == "No fix was measured in this run."
    only_05 = diagnose(FLOOR)
    assert only_05.slow.startswith("A verify step at 185k tokens takes 1,430 ms")
    idle = diagnose([_f("utilization.decode_gpu_idle", "warning", "02_gpu_utilization", decode_gpu_util_pct_median=35.0)])
    assert "no GPU kernel runs for about 65% of decode" in idle.cause


def test_page_pieces_order_collapse_and_round() -> None:
    from specdiag.steps.findings import page
    from specdiag.steps.findings.diagnosis import diagnose

    found = overview.collect_findings({"00_snapshot": {"findings": [finding("snapshot.speculation", "info")]},
                                       "01_baseline_sweep": {"findings": SWEEP},
                                       "05_bandwidth_analysis": {"findings": FLOOR}})
    html = page.findings_html(found)
    top, rest = html.split("<details style=\"margin:8px 0\">", 1)
    assert top.index("sweep.decode_collapse") < top.index("bandwidth.far_from_floor") < top.index("sweep.step_time_slope")
    assert "snapshot.speculation" in rest and "1 more: 1 info, 0 ok" in rest
    box = page.diagnosis_html(diagnose(found), found, {"06_kernel_ab": "data/reference/kernel-ab-h200"})
    assert "This run: 3 critical, 1 warning" in box and "data/reference/kernel-ab-h200" in box and "not counted" in box
    from specdiag.tables import brief

    assert brief(0.123456789012345) == "0.123" and brief(13095873024.0) == "13,095,873,024"
    assert brief(list(range(20))) == "[0, 1, 2, 3, 4, 5, ...] (20)" and brief({"a": [1, 2]}) == "1 entries"


def test_the_diagnosis_names_both_collapses_and_the_measured_fix_of_each() -> None:
    """09 at 61 layers: Triton's verify step grows 84x, prefill sits 52x above its floor; the plugin fixes decode
    170x and FlashInfer's prefill brings the first token 20x sooner, each said with its numbers."""
    from specdiag.steps.findings.diagnosis import diagnose

    stock = _f("engine_ab.stock_decode", "critical", "09_engine_ab", arm="triton", step_ms_first=19.7,
               step_ms_last=1657.0, context_tokens_first=1024, context_tokens_last=131072, step_growth_x=84.1)
    floor = _f("engine_ab.prefill_floor", "critical", "09_engine_ab", arm="triton", context_tokens=131072, ttft_s=150.8,
               floor_s=2.88, ttft_over_floor_x=52.4, chunk_tokens=8192, prefill_tok_s=869.0)
    decode_fix = _f("engine_ab.decode_fix", "ok", "09_engine_ab", fix="the specdiag plugin's verify kernel",
                    fix_speedup_x=170.5, fix_context_tokens=131072, fix_phase="decode")
    prefill_fix = _f("engine_ab.prefill_fix", "ok", "09_engine_ab", fix="flashinfer's prefill", fix_speedup_x=19.9,
                     fix_context_tokens=65536, fix_phase="prefill")
    d = diagnose([stock, floor, decode_fix, prefill_fix])
    assert d.slow.startswith("A verify step of triton takes 1,657 ms at 128k tokens against 19.7 ms at 1k tokens, 84.1x")
    assert d.prefill.startswith("Prefill is a second collapse: the first token of a 128k-token prompt comes after 151 s "
                                "on triton, 52.4x its floor of 2.88 s, prefilled in chunks of 8,192 tokens")
    assert "the specdiag plugin's verify kernel, makes it 170x faster at 128k tokens" in d.fix
    assert "For prefill, flashinfer's prefill brings the first token 19.9x sooner at 64k tokens" in d.fix
    assert d.numbers["prefill_ttft_over_floor_x"] == 52.4 and d.numbers["prefill_fix_speedup_x"] == 19.9
    assert d.paragraph.index("Prefill is") < d.paragraph.index("The fix measured")
    # a prefill collapse without a measured prefill fix: a pointer, not a result; 05's finding reads the same way
    only = diagnose(SWEEP + FLOOR + [{**floor, "id": "bandwidth.prefill_floor", "notebook": "05_bandwidth_analysis"}])
    assert only.fix.startswith("No decode fix was measured in this run")
    assert "No prefill fix was measured here" in only.fix and "09_engine_ab" in only.fix
    near = diagnose([{**floor, "numbers": {**floor["numbers"], "ttft_over_floor_x": 1.4}}])
    assert near.prefill.startswith("Prefill is near its floor") and near.fix == "No fix was measured in this run."


def _repeats(step_ms: dict[int, list[float]]) -> list[dict]:
    return [{"context_tokens": c, "repeat": i, "prompt_kind": "novel", "seed": i, "max_new_tokens": 9,
             "decode_tok_s": 1000.0 / ms, "step_ms": ms, "completion_tokens": 9, "verify_steps": 4, "ttft_s": 0.1,
             "error": None} for c, mss in step_ms.items() for i, ms in enumerate(mss)]


def test_two_runs_compare_requests_with_an_interval_and_call_overlap_a_tie() -> None:
    """08 compares requests, not steps: 3 requests a side give a verdict with its interval, overlapping requests are
    a tie, fewer than 3 say so."""
    a = _repeats({1000: [10.0, 10.5, 9.8], 4000: [40.0, 41.0, 39.0], 8000: [80.0, 81.0]})
    b = _repeats({1000: [10.2, 9.9, 10.4], 4000: [13.0, 13.4, 12.9], 8000: [20.0, 21.0]})
    cmp = {r["context_tokens"]: r for r in overview.compare_sweeps(a, b)}
    assert cmp[1000]["step_verdict"] == "tie" and cmp[1000]["step_ratio_lo"] < 1 < cmp[1000]["step_ratio_hi"]
    assert cmp[4000]["step_verdict"] == "faster" and cmp[4000]["step_ratio_hi"] < 1
    assert cmp[4000]["decode_verdict"] == "faster"
    assert cmp[8000]["step_verdict"] == "not enough requests" and cmp[8000]["step_ratio_lo"] is None
    found = {f.id: f for f in overview.comparison_findings(list(cmp.values()), None, None, [])}
    test = found["compare.step_time_test"]
    assert test.numbers["faster_at"] == [4000] and test.numbers["tie_at"] == [1000]
    assert test.numbers["not_enough_at"] == [8000] and test.severity == "ok"
    assert "not enough requests" in found["compare.decode_speed"].verdict  # its last common context has 2 a side
