"""The plugin's recorded H200 runs as a user replays them on a CPU (data/reference/README.md): 01 on the plugin arm,
08 (make compare) on the two comparisons of params/compare-plugin*.yaml, 05 with params/plugin-projection.yaml, 00 on
a recorded arm. What is asserted is what those pages show: measured rows as the notebooks compute them."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Callable

import pytest

from specdiag import report
from specdiag.paths import PROJECT_ROOT, REFERENCE_DIR

STOCK, PLUGIN = "sglang-h200-mla2-stock-traced", "sglang-h200-mla2-plugin-traced"
CONTEXTS = [1024, 4096, 16384, 32768, 65536, 131072]


def _compare(tmp_path: Path, params_file: str) -> dict:
    out = tmp_path / "cmp"
    assert report.main(["compare", "--params", str(PROJECT_ROOT / params_file), "--run-dir", str(out)]) == 0
    return json.loads((out / "findings" / "08_compare_runs.json").read_text())


@pytest.mark.notebook
def test_01_replays_the_plugin_flat_in_context(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    """The plugin arm's step does not grow with context: 2.38 ms at 131,072 tokens against 2.45 at 1,024 (measured)."""
    run_notebook("01_baseline_sweep", replay_dir=str(REFERENCE_DIR / PLUGIN))
    m = json.loads((tmp_path / "run" / "findings" / "01_baseline_sweep.json").read_text())["metrics"]
    assert m["context_tokens"] == CONTEXTS
    assert m["step_ms"][-1] / m["step_ms"][0] == pytest.approx(0.97, abs=0.02)


@pytest.mark.notebook
def test_compare_stock_vs_plugin_from_the_params_file(tmp_path: Path) -> None:
    """make compare PARAMS=params/compare-plugin.yaml: decode per context, and where each step goes (the traces)."""
    m = _compare(tmp_path, "params/compare-plugin.yaml")["metrics"]
    # a page a reader can share: the reference folders are named relative to the project, not by this machine's path
    assert (m["run_a"], m["run_b"]) == (f"data/reference/{STOCK}", f"data/reference/{PLUGIN}")
    assert m["common_contexts"] == CONTEXTS
    assert m["decode_ratio_b_a"][-1] > 10  # 15.3x decode tok/s at 131,072 (step 55.82 vs 2.38 ms, commit 1.54 vs 1.00)
    prof = {(p["run"], int(p["context_tokens"])): p for p in m["step_profile"]}
    assert prof[("A", 131072)]["gpu_attn_sglang_triton_ms"] > 45          # stock's verify kernel: 50.3 ms per step
    assert prof[("B", 131072)]["gpu_attn_specdiag_splitkv_ms"] < 0.4      # the plugin's, both layers: 0.26 ms
    assert prof[("B", 131072)]["gpu_busy_ms"] < 1 and prof[("B", 1024)]["gpu_busy_ms"] < 0.5
    out = tmp_path / "cmp"
    assert (out / "html").is_dir()
    for page in [out / "index.html", *(out / "html").glob("*.html")]:
        assert str(PROJECT_ROOT) not in page.read_text(), page.name


@pytest.mark.notebook
def test_compare_upstream_vs_plugin_compares_requests(tmp_path: Path) -> None:
    """make compare PARAMS=params/compare-plugin-upstream.yaml: 7 requests per context and arm, so 08 says per context
    whether B's step is slower (at no context), faster (at 131,072 tokens: 2.65 against 4.08 ms median, the ratio's
    interval over requests 0.59-0.94) or a tie (1k-64k: each interval holds 1)."""
    res = _compare(tmp_path, "params/compare-plugin-upstream.yaml")
    m = res["metrics"]
    assert m["common_contexts"] == [1024, 16384, 65536, 131072]
    assert m["step_verdict"] == ["tie", "tie", "tie", "faster"]
    test = next(f for f in res["findings"] if f["id"] == "compare.step_time_test")
    assert test["severity"] == "ok" and "slower than A's at no context" in test["verdict"]


@pytest.mark.notebook
def test_00_replays_a_recorded_arm_without_touching_this_machine(run_notebook: Callable[..., Path],
                                                                  tmp_path: Path) -> None:
    """The arm's run.json records no hardware and its server URL was 127.0.0.1 on the H200: a replay must not take
    that URL for a server on this machine (it once tried to measure CUDA on a CPU-only host and failed)."""
    run_notebook("00_snapshot", replay_dir=str(REFERENCE_DIR / PLUGIN))
    result = json.loads((tmp_path / "run" / "findings" / "00_snapshot.json").read_text())
    assert result["metrics"]["hardware_where"] == "recorded run"


def _attention_medians(arm: str) -> dict[int, tuple[float, float]]:
    """Per profiled context of a committed arm: (median verify-attention ms, median KV-index ms) over its complete
    verify steps, computed here straight from step_profile.jsonl (not by verify_projection)."""
    rows = [json.loads(x) for x in (REFERENCE_DIR / arm / "step_profile.jsonl").read_text().splitlines()]
    out = {}
    for c in sorted({r["context_tokens"] for r in rows}):
        used = [r for r in rows if r["context_tokens"] == c and not r["partial"] and r["verify_step"]]
        att = [sum(r[k] for k in r if k.startswith("gpu_attn_")) for r in used]
        out[c] = (statistics.median(att), statistics.median(r["gpu_kv_indices_ms"] for r in used))
    return out


@pytest.mark.notebook
def test_05_projects_the_plugin_from_its_traces(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    """05 with params/plugin-projection.yaml: the traced projection beside the step-based one."""
    params = report.load_params_file("params/plugin-projection.yaml")["05_bandwidth_analysis"]
    assert params["stock_dir"] == f"data/reference/{STOCK}"
    # the run records no hardware: the H200's peaks as parameters, else 05 would time this machine's CPU (a bf16
    # matmul, about 20 s here), which no assertion below reads
    run_notebook("05_bandwidth_analysis", replay_dir=str(REFERENCE_DIR / PLUGIN), **params,
                 memory_bandwidth_gb_s=4800.0, matmul_tflops=989.0)
    m = json.loads((tmp_path / "run" / "findings" / "05_bandwidth_analysis.json").read_text())["metrics"]
    tp = m["traced_projection"]
    assert m["traced_projection_missing"] is None and tp["layers_measured"] == 2
    assert (tp["layers_target"], tp["target_context"]) == (61, 185_000)
    stock, plugin = _attention_medians(STOCK), _attention_medians(PLUGIN)
    assert sorted(stock) == [131072] and sorted(plugin) == [1024, 131072]
    # stock: one trace, proportional: 50.285 ms per step (measured) / 2 layers x 185,000 / 131,072 x 61 layers
    s_att, s_kv = stock[131072]
    assert tp["stock"]["method"] == "proportional" and tp["stock"]["target_source"] == "extrapolated"
    assert tp["stock"]["target_attention_ms"] == pytest.approx(s_att / 2 * 185_000 / 131_072 * 61, rel=1e-9)
    assert tp["stock"]["target_attention_ms"] == pytest.approx(2164.7, abs=0.5)
    assert tp["stock"]["target_per_step_ms"] == pytest.approx(s_kv * 185_000 / 131_072, rel=1e-9)  # once, not x 61
    # plugin: two traces, a line per layer through (1,024, 0.0322) and (131,072, 0.1309 ms)
    (a1, k1), (a2, k2) = plugin[1024], plugin[131072]
    slope = (a2 - a1) / 2 / (131_072 - 1_024)
    assert tp["fixed"]["method"] == "line"
    assert tp["fixed"]["attention_fit_per_layer"]["fixed_ms"] == pytest.approx(a1 / 2 - slope * 1_024, rel=1e-6)
    assert tp["fixed"]["target_attention_ms"] == pytest.approx(61 * (a1 / 2 + slope * (185_000 - 1_024)), rel=1e-6)
    assert tp["fixed"]["target_attention_ms"] == pytest.approx(10.48, abs=0.05)
    assert tp["fixed"]["target_per_step_ms"] == pytest.approx(k1 + (k2 - k1) / (131_072 - 1_024) * (185_000 - 1_024))
    assert tp["target_saved_ms"] == pytest.approx(2154.2, abs=0.5)
    # the step-based projection beside it: the stock's whole-step growth carries 5.65 ms per step that is not
    # attention (SGLang's NGRAM drafting on the CPU); the plugin's, with the prompt-tail drafting, 0.12 ms
    d_stock, d_plugin = m["traced_vs_step_growth"]
    assert d_stock["step_growth_ms"] == pytest.approx(m["stock_pair"]["target_stock_growth_ms"])
    assert d_stock["other_growth_per_step_ms"] == pytest.approx(5.65, abs=0.02)
    assert d_plugin["other_growth_per_step_ms"] == pytest.approx(0.12, abs=0.01)
