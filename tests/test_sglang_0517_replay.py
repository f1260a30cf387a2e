"""The real SGLang 0.5.17 reference runs (data/reference/sglang-h200-tiny-*, sglang-h200-mla2-stock-185k) replayed
through their notebooks on a CPU: what each page must say from the H200's numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from specdiag.paths import REFERENCE_DIR

TINY = REFERENCE_DIR / "sglang-h200-tiny-standalone"
MLA = REFERENCE_DIR / "sglang-h200-mla2-stock-185k"


def _findings(tmp_path: Path, name: str) -> dict[str, Any]:
    res = json.loads((tmp_path / "run" / "findings" / f"{name}.json").read_text())
    return {"metrics": res["metrics"], **{f["id"]: f for f in res["findings"]}}


@pytest.mark.notebook
def test_mla_step_rises_with_context_and_05_measures_the_floor(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    run_notebook("01_baseline_sweep", replay_dir=str(MLA))
    f = _findings(tmp_path, "01_baseline_sweep")
    steps = f["metrics"]["step_ms"]
    assert f["metrics"]["context_tokens"] == [1024, 4096, 16384, 32768, 65536, 131072, 185000]
    assert steps == sorted(steps) and steps[-1] > 30 * steps[0]  # 2.41 -> 78.3 ms, measured on the H200
    assert f["sweep.step_time_slope"]["numbers"]["slope_ms_per_1k_tokens"] == pytest.approx(0.413, abs=0.001)
    run_notebook("05_bandwidth_analysis", replay_dir=str(MLA))
    b = _findings(tmp_path, "05_bandwidth_analysis")
    assert b["metrics"]["stock_pair"] is None  # no stock_dir: no per-layer projection
    far = b["bandwidth.far_from_floor"]
    assert far["severity"] == "critical" and "793x its floor" in far["verdict"]


@pytest.mark.notebook
def test_tiny_03_says_the_window_was_ignored_and_04_shows_the_contrast(run_notebook: Callable[..., Path],
                                                                         tmp_path: Path) -> None:
    run_notebook("03_drafter_inspection", replay_dir=str(TINY))
    f = _findings(tmp_path, "03_drafter_inspection")
    assert f["drafter.window_honoured"]["severity"] == "warning" and "ignores" in f["drafter.window_honoured"]["title"]
    assert f["metrics"]["window_honoured"] is False
    assert (f["metrics"]["n_full_layers"], f["metrics"]["n_full_layers_as_run"]) == (1, 3)
    assert f["drafter.attention_bounded"]["numbers"]["n_full_layers"] == 3
    assert f["drafter.cost_difference"]["numbers"]["drafter_ms_last"] == pytest.approx(3.657, abs=0.001)
    # one request per server and context in this recording: the difference is tabled, no verdict drawn from it
    assert f["drafter.cost_difference"]["numbers"]["reading"] == "not enough requests"
    assert "not enough requests" in f["drafter.cost_difference"]["verdict"]
    assert f["drafter.window_honoured"]["numbers"]["rows_beyond_window"] == 6
    run_notebook("04_commit_probe", replay_dir=str(TINY))
    p = _findings(tmp_path, "04_commit_probe")
    # one request per (kind, context) in this recording: the contrast is tabled, but no verdict is drawn from it
    assert p["metrics"]["commit_length"]["novel"]["16000"] < 0.5 * p["metrics"]["commit_length"]["predictable"]["16000"]
    assert p["probe.predictable_not_enough"]["severity"] == p["probe.novel_not_enough"]["severity"] == "info"
    assert "probe.predictable_flat" not in p and "probe.novel_is_text_difficulty" not in p
