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
    assert found["compare.decode_speed"].severity == "ok"
    assert found["compare.decode_speed"].numbers["decode_ratio_b_a_geomean"] == pytest.approx((2.0 * 3.0) ** 0.5)
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
