"""Issue 12's three H200 arms (data/reference/h200-sglang-mla-{stock,upstream-splitkv,plugin-splitkv}) replayed on a
CPU: 01 for each arm, and 08 (make compare) on stock vs plugin from params/compare-plugin.yaml."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from specdiag import report
from specdiag.paths import PROJECT_ROOT, REFERENCE_DIR

ARMS = ("h200-sglang-mla-stock", "h200-sglang-mla-upstream-splitkv", "h200-sglang-mla-plugin-splitkv")


@pytest.mark.notebook
@pytest.mark.parametrize("arm", ARMS)
def test_01_replays_each_arm(arm: str, run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    run_notebook("01_baseline_sweep", replay_dir=str(REFERENCE_DIR / arm))
    m = json.loads((tmp_path / "run" / "findings" / "01_baseline_sweep.json").read_text())["metrics"]
    assert m["context_tokens"] == [1024, 4096, 16384, 32768, 65536, 131072]
    steps = m["step_ms"]
    assert steps[0] == pytest.approx(2.25, abs=0.05)  # every arm's 1,024-token step, measured: 2.25-2.28 ms
    assert steps[-1] > 3 * steps[0]


@pytest.mark.notebook
def test_compare_stock_vs_plugin_from_the_params_file(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    assert report.main(["compare", "--params", str(PROJECT_ROOT / "params/compare-plugin.yaml"),
                        "--run-dir", str(out)]) == 0
    m = json.loads((out / "findings" / "08_compare_runs.json").read_text())["metrics"]
    assert m["run_a"].endswith("h200-sglang-mla-stock") and m["run_b"].endswith("h200-sglang-mla-plugin-splitkv")
    assert m["common_contexts"] == [1024, 4096, 16384, 32768, 65536, 131072]
    # decode tok/s B/A at 131,072: the plugin's 116 against stock's 24 tok/s (measured), with unequal commit lengths
    assert m["decode_ratio_b_a"][-1] > 4
    assert (out / "html").is_dir()
    # a page a reader can share: the reference folders are named relative to the project, not by this machine's path
    assert m["run_a"] == "data/reference/h200-sglang-mla-stock"
    for page in [out / "index.html", *(out / "html").glob("*.html")]:
        assert str(PROJECT_ROOT) not in page.read_text(), page.name


@pytest.mark.notebook
def test_00_replays_the_plugin_arm_without_touching_this_machine(run_notebook: Callable[..., Path],
                                                                   tmp_path: Path) -> None:
    """The arm's run.json records no hardware and its server URL was 127.0.0.1 on the H200: a replay must not take
    that URL for a server on this machine (it once tried to measure CUDA on a CPU-only host and failed)."""
    run_notebook("00_snapshot", replay_dir=str(REFERENCE_DIR / "h200-sglang-mla-plugin-splitkv"))
    result = json.loads((tmp_path / "run" / "findings" / "00_snapshot.json").read_text())
    assert result["metrics"]["hardware_where"] == "recorded run"


S3 = ("h200-sglang-mla-s3-stock", "h200-sglang-mla-s3-plugin-attn", "h200-sglang-mla-s3-plugin",
      "h200-sglang-mla-s3-upstream-tail")


@pytest.mark.notebook
def test_01_replays_the_shipped_plugin_flat_in_context(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    """Session 3 (split-KV + NGRAM prompt-tail): the 131,072-token step measured 2.38 ms against 2.45 at 1,024."""
    run_notebook("01_baseline_sweep", replay_dir=str(REFERENCE_DIR / "h200-sglang-mla-s3-plugin"))
    m = json.loads((tmp_path / "run" / "findings" / "01_baseline_sweep.json").read_text())["metrics"]
    assert m["context_tokens"] == [1024, 4096, 16384, 32768, 65536, 131072]
    assert m["step_ms"][-1] / m["step_ms"][0] == pytest.approx(0.97, abs=0.02)


@pytest.mark.notebook
def test_compare_s3_stock_vs_plugin(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    assert report.main(["compare", "--params", str(PROJECT_ROOT / "params/compare-plugin-s3.yaml"),
                        "--run-dir", str(out)]) == 0
    m = json.loads((out / "findings" / "08_compare_runs.json").read_text())["metrics"]
    assert m["run_b"] == "data/reference/h200-sglang-mla-s3-plugin"
    assert m["decode_ratio_b_a"][-1] > 10  # 15.3x decode tok/s at 131,072 (step 23.5x, commit 1.54 vs 1.00)
    # where the step goes, from the traces (computed from data/reference/*/step_profile.jsonl)
    prof = {(p["run"], int(p["context_tokens"])): p for p in m["step_profile"]}
    assert prof[("A", 131072)]["gpu_attn_sglang_triton_ms"] > 45          # stock's verify kernel: 50.3 ms per step
    assert prof[("B", 131072)]["gpu_attn_specdiag_splitkv_ms"] < 0.4      # the plugin's, both layers: 0.26 ms
    assert prof[("B", 131072)]["gpu_busy_ms"] < 1 and prof[("B", 1024)]["gpu_busy_ms"] < 0.5


@pytest.mark.parametrize("arm", S3)
def test_s3_arms_record_their_environment_and_rows(arm: str) -> None:
    run = json.loads((REFERENCE_DIR / arm / "run.json").read_text())
    rows = [json.loads(x) for x in (REFERENCE_DIR / arm / "sweep.jsonl").read_text().splitlines()]
    assert [r["context_tokens"] for r in rows] == [1024, 4096, 16384, 32768, 65536, 131072]
    assert all(r["error"] is None and r["step_ms"] > 0 for r in rows)
    env = run["arm"]["env"]
    assert env.get("SPECDIAG_SGLANG_NGRAM_TAIL") == {"stock": None, "plugin-attn": "0", "plugin": "1",
                                                   "upstream-tail": "1"}[run["arm"]["name"]]


def test_s3_tp2_check_passed_on_both_ranks() -> None:
    check = json.loads((REFERENCE_DIR / "h200-sglang-mla-s3-plugin/device-tp2/check.json").read_text())
    assert check["passed"] and check["calls_compared"] == 416 and check["max_rel_err"] < 2e-3
    assert {c["heads"] for c in check["calls"]} == {4}  # 8 heads over TP 2: 4 local heads per rank


def _attention_medians(arm: str) -> dict[int, tuple[float, float]]:
    """Per profiled context of a committed arm: (median verify-attention ms, median KV-index ms) over its complete
    verify steps, computed here straight from step_profile.jsonl (not by verify_projection)."""
    import statistics  # noqa: PLC0415

    rows = [json.loads(x) for x in (REFERENCE_DIR / arm / "step_profile.jsonl").read_text().splitlines()]
    out = {}
    for c in sorted({r["context_tokens"] for r in rows}):
        used = [r for r in rows if r["context_tokens"] == c and not r["partial"] and r["verify_step"]]
        att = [sum(r[k] for k in r if k.startswith("gpu_attn_")) for r in used]
        out[c] = (statistics.median(att), statistics.median(r["gpu_kv_indices_ms"] for r in used))
    return out


@pytest.mark.notebook
def test_05_projects_the_s3_plugin_from_its_traces(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    """05 with params/plugin-projection-s3.yaml on the shipped plugin: the traced projection beside the step-based one."""
    params = report.load_params_file("params/plugin-projection-s3.yaml")["05_bandwidth_analysis"]
    run_notebook("05_bandwidth_analysis", replay_dir=str(REFERENCE_DIR / "h200-sglang-mla-s3-plugin"), **params)
    m = json.loads((tmp_path / "run" / "findings" / "05_bandwidth_analysis.json").read_text())["metrics"]
    tp = m["traced_projection"]
    assert m["traced_projection_missing"] is None and tp["layers_measured"] == 2
    assert (tp["layers_target"], tp["target_context"]) == (61, 185_000)
    stock, plugin = _attention_medians("h200-sglang-mla-s3-stock"), _attention_medians("h200-sglang-mla-s3-plugin")
    assert sorted(stock) == [131072] and sorted(plugin) == [1024, 131072]
    # stock: one trace, proportional: 50.285 ms per step (measured) / 2 layers x 185,000 / 131,072 x 61 layers
    s_att, s_kv = stock[131072]
    assert tp["stock"]["method"] == "proportional" and tp["stock"]["target_source"] == "extrapolated"
    assert tp["stock"]["target_attention_ms"] == pytest.approx(s_att / 2 * 185_000 / 131_072 * 61, rel=1e-9)
    assert tp["stock"]["target_attention_ms"] == pytest.approx(2164.7, abs=0.5)
    assert tp["stock"]["target_per_step_ms"] == pytest.approx(s_kv * 185_000 / 131_072, rel=1e-9)  # once, not x 61
    assert tp["stock"]["target_per_step_ms"] == pytest.approx(0.197, abs=0.002)
    # plugin: two traces, a line per layer through (1,024, 0.0322) and (131,072, 0.1309 ms)
    (a1, k1), (a2, k2) = plugin[1024], plugin[131072]
    slope = (a2 - a1) / 2 / (131_072 - 1_024)
    assert tp["fixed"]["method"] == "line"
    assert tp["fixed"]["attention_fit_per_layer"]["fixed_ms"] == pytest.approx(a1 / 2 - slope * 1_024, rel=1e-6)
    assert tp["fixed"]["attention_fit_per_layer"]["fixed_ms"] == pytest.approx(0.0314, abs=0.0005)
    assert tp["fixed"]["attention_fit_per_layer"]["ms_per_1k_tokens"] == pytest.approx(0.00076, abs=0.00002)
    assert tp["fixed"]["target_attention_ms"] == pytest.approx(61 * (a1 / 2 + slope * (185_000 - 1_024)), rel=1e-6)
    assert tp["fixed"]["target_attention_ms"] == pytest.approx(10.48, abs=0.05)
    assert tp["fixed"]["target_per_step_ms"] == pytest.approx(k1 + (k2 - k1) / (131_072 - 1_024) * (185_000 - 1_024))
    assert tp["target_saved_ms"] == pytest.approx(2154.2, abs=0.5)
    # beside the step-based projection: the stock's whole-step growth carries 5.65 ms per step that is not attention
    # (SGLang's NGRAM drafting on the CPU); the plugin's, with the prompt-tail drafting, 0.12 ms
    d_stock, d_plugin = m["traced_vs_step_growth"]
    assert d_stock["step_growth_ms"] == pytest.approx(m["stock_pair"]["target_stock_growth_ms"])
    assert d_stock["step_growth_ms"] == pytest.approx(2325.2, abs=0.5) and d_stock["traced_growth_ms"] == pytest.approx(2152.7, abs=0.5)
    assert d_stock["other_growth_per_step_ms"] == pytest.approx(5.65, abs=0.02)
    assert d_plugin["other_growth_per_step_ms"] == pytest.approx(0.12, abs=0.01)


@pytest.mark.notebook
def test_05_on_plugin_attn_shows_the_step_based_overstatement(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    """The same params on the plugin-attn arm (SGLang's NGRAM kept): its whole-step growth x 61 layers is about 20x
    its traced attention growth, because NGRAM's per-step CPU drafting grows with context."""
    params = report.load_params_file("params/plugin-projection-s3.yaml")["05_bandwidth_analysis"]
    run_notebook("05_bandwidth_analysis", replay_dir=str(REFERENCE_DIR / "h200-sglang-mla-s3-plugin-attn"), **params)
    m = json.loads((tmp_path / "run" / "findings" / "05_bandwidth_analysis.json").read_text())["metrics"]
    _, d_fixed = m["traced_vs_step_growth"]
    assert m["traced_projection"]["fixed"]["method"] == "proportional"
    assert d_fixed["step_growth_ms"] / d_fixed["traced_growth_ms"] == pytest.approx(22.6, abs=0.3)  # 253.2 vs 11.2 ms


S4_ARMS3 = ("h200-sglang-mla-s4-arms3-stock", "h200-sglang-mla-s4-arms3-plugin", "h200-sglang-mla-s4-arms3-upstream-tail")


def _sweep(folder: str) -> list[dict]:
    return [json.loads(x) for x in (REFERENCE_DIR / folder / "sweep.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("arm", S4_ARMS3)
def test_s4_three_arms_have_seven_repeats_per_context(arm: str) -> None:
    rows = _sweep(arm)
    assert sorted({r["context_tokens"] for r in rows}) == [1024, 16384, 65536, 131072]
    assert all(sum(r["context_tokens"] == c for r in rows) == 7 for c in (1024, 16384, 65536, 131072))
    assert all(r["error"] is None and r["step_ms"] > 0 for r in rows)


def test_s4_plugin_is_not_slower_than_upstream_at_any_context() -> None:
    """Issue 12's target "at least as fast as upstream at every context", with the repeats' rank test: the plugin's
    step is slower at no context; at 131,072 tokens it is faster (upstream's verify kernel is then longer than the
    CPU-bound rest of the step); at 1k-64k the step is the scheduler's CPU time and the arms are indistinguishable."""
    from specdiag.steps.findings import overview  # noqa: PLC0415

    cmp = overview.compare_sweeps(_sweep("h200-sglang-mla-s4-arms3-upstream-tail"), _sweep("h200-sglang-mla-s4-arms3-plugin"))
    verdicts = {r["context_tokens"]: r["step_verdict"] for r in cmp}
    assert "slower" not in verdicts.values()
    assert verdicts[131072] == "faster"
    last = cmp[-1]
    assert last["step_ms_diff_b_a"] < -1.0 and last["p_b_faster"] < 0.01  # 2.65 vs 4.08 ms median, p 0.0055
    # the same test on the two other calls of the session (one GPU for both arms): slower at no context either
    for a, b in (("h200-sglang-mla-s4-upstream-tail", "h200-sglang-mla-s4-plugin"),
                 ("h200-sglang-mla-s4-short-upstream-tail", "h200-sglang-mla-s4-short-plugin")):
        assert all(r["step_verdict"] != "slower" for r in overview.compare_sweeps(_sweep(a), _sweep(b)))


def test_s4_stock_against_plugin_from_the_repeats() -> None:
    """Stock Triton verify grows 21x from 1k to 128k; the plugin stays flat (every plugin request faster than every
    stock request from 16k on)."""
    from specdiag.steps.findings import overview  # noqa: PLC0415

    cmp = {r["context_tokens"]: r for r in overview.compare_sweeps(_sweep("h200-sglang-mla-s4-arms3-stock"),
                                                                  _sweep("h200-sglang-mla-s4-arms3-plugin"))}
    assert cmp[131072]["step_ms_a"] / cmp[131072]["step_ms_b"] > 10   # issue target: >= 10x at 128k
    assert cmp[131072]["step_ms_b"] / cmp[1024]["step_ms_b"] < 2       # issue target: <= 2x its 1k step
    assert all(cmp[c]["step_verdict"] == "faster" for c in (16384, 65536, 131072))


def test_s4_traces_place_the_verify_kernels_inside_sglang() -> None:
    """At 65,536 tokens, inside SGLang (step_profile rows computed from the committed traces): SGLang's upstream
    split-KV verify (its two stages) takes about 10x the GPU time of the plugin's, in a step that both arms spend
    mostly on the scheduler's CPU."""
    def med(folder: str, key: str) -> float:
        import statistics  # noqa: PLC0415
        rows = [json.loads(x) for x in (REFERENCE_DIR / folder / "step_profile.jsonl").read_text().splitlines()]
        vals = [float(r[key]) for r in rows if r["verify_step"] and not r["partial"]]
        return statistics.median(vals)

    ours = med("h200-sglang-mla-s4-plugin", "gpu_attn_specdiag_splitkv_ms")
    theirs = med("h200-sglang-mla-s4-upstream-tail", "gpu_attn_sglang_verify_splitkv_ms")
    assert 0.1 < ours < 0.25 and 1.0 < theirs < 2.5 and theirs / ours > 8


@pytest.mark.notebook
def test_compare_s4_upstream_vs_plugin_reports_the_rank_test(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    assert report.main(["compare", "--params", str(PROJECT_ROOT / "params/compare-plugin-upstream-s4.yaml"),
                        "--run-dir", str(out)]) == 0
    res = json.loads((out / "findings" / "08_compare_runs.json").read_text())
    m = res["metrics"]
    assert m["common_contexts"] == [1024, 16384, 65536, 131072]
    assert m["step_verdict"][-1] == "faster" and "slower" not in m["step_verdict"]
    test = next(f for f in res["findings"] if f["id"] == "compare.step_time_test")
    assert test["severity"] == "ok" and "slower than A's at no context" in test["verdict"]
