"""Execute notebooks/07_findings.ipynb and 08_compare_runs.ipynb on synthetic run folders (no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdiag.findings import Finding
from specdiag.runs import Run

pytestmark = [pytest.mark.notebook, pytest.mark.slow]


def make_run(path: Path, decode: dict[int, float], step: dict[int, float], severity: str) -> Run:
    run = Run.create(path, server={"speculative_algorithm": "STANDALONE", "attention_backend": "triton", "page_size": 1})
    for c in decode:
        run.append_row("sweep", {"context_tokens": c, "repeat": 0, "prompt_kind": "novel", "seed": 0, "max_new_tokens": 9,
                                 "decode_tok_s": decode[c], "step_ms": step[c], "completion_tokens": 9,
                                 "verify_steps": 4, "ttft_s": 0.1, "error": None})
    run.write_result("01_baseline_sweep", findings=[
        Finding("sweep.decode_collapse", "Decode speed vs context", "falls", severity, ("e",), {"x": 1}, "measured")],
        metrics={"step_slope_ms_per_1k_tokens": 1.0})
    run.write_result("00_snapshot", findings=[
        Finding("snapshot.speculation", "Speculative decoding is on", "STANDALONE", "info")], metrics={})
    return run


def test_findings_page_gathers_every_notebook(run_notebook, tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", {1000: 100.0, 4000: 10.0}, {1000: 10.0, 4000: 100.0}, "critical")
    run_notebook("07_findings", run_dir=str(run.path))
    result = json.loads((run.path / "findings" / "07_findings.json").read_text())
    overall = result["findings"][0]
    assert overall["id"] == "findings.overall" and overall["severity"] == "critical"
    assert result["metrics"]["notebooks"] == ["00_snapshot", "01_baseline_sweep"]
    assert "02_gpu_utilization" in result["metrics"]["missing"]
    assert "Decode speed vs context" in overall["verdict"]


def test_findings_page_needs_a_run_dir(run_notebook, tmp_path: Path) -> None:
    import papermill

    with pytest.raises(papermill.PapermillExecutionError, match="run_dir is empty"):
        run_notebook("07_findings", run_dir="")


def test_compare_two_runs(run_notebook, tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", {1000: 100.0, 4000: 10.0}, {1000: 10.0, 4000: 100.0}, "critical")
    b = make_run(tmp_path / "b", {1000: 120.0, 4000: 40.0}, {1000: 8.0, 4000: 25.0}, "warning")
    out = tmp_path / "cmp"
    run_notebook("08_compare_runs", run_a=str(a.path), run_b=str(b.path), run_dir=str(out))
    result = json.loads((out / "findings" / "08_compare_runs.json").read_text())
    found = {f["id"]: f for f in result["findings"]}
    assert result["metrics"]["common_contexts"] == [1000, 4000]
    assert result["metrics"]["decode_ratio_b_a"] == pytest.approx([1.2, 4.0])
    assert found["compare.decode_speed"]["numbers"]["decode_ratio_b_a_last"] == pytest.approx(4.0)
    assert result["metrics"]["slope_a_ms_per_1k_tokens"] == pytest.approx(30.0)
    assert result["metrics"]["slope_b_ms_per_1k_tokens"] == pytest.approx(17 / 3)
    assert found["compare.verdicts"]["numbers"] == {"changed": 1, "findings": 2}
    assert Run.open(out).meta["compare"] == {"run_a": str(a.path), "run_b": str(b.path)}
