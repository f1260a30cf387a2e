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
