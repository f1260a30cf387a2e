"""The step_profile run-folder table (specdiag.telemetry.torch_trace: step_profile_rows, record_step_profile)
and 08's view of it (specdiag.steps.findings.step_profile_view), on synthetic traces with known answers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from specdiag.runs import Run
from specdiag.steps.findings import step_profile_view as view
from specdiag.telemetry import torch_trace
from test_torch_trace import three_steps


def write_trace(path: Path) -> Path:
    path.write_bytes(gzip.compress(json.dumps({"schemaVersion": 1, "traceEvents": three_steps()}).encode()))
    return path


def test_record_step_profile(tmp_path: Path) -> None:
    run = Run.create(tmp_path / "run")
    trace = write_trace(tmp_path / "plugin-131072-TP-0.trace.json.gz")
    rows = torch_trace.record_step_profile(run, trace, context_tokens=131072, arm="plugin")
    assert len(rows) == 3 and [r["partial"] for r in rows] == [False, False, True]
    stored = run.rows(torch_trace.STEP_PROFILE_TABLE)
    assert [r["step"] for r in stored] == [0, 1, 2]
    assert stored[0]["arm"] == "plugin" and stored[0]["context_tokens"] == 131072
    assert stored[0]["trace_file"] == trace.name and stored[0]["gpu_busy_ms"] == pytest.approx(0.56)
    # recording the same trace again appends nothing
    again = torch_trace.record_step_profile(run, trace, context_tokens=131072, arm="plugin")
    assert len(again) == 3 and len(run.rows(torch_trace.STEP_PROFILE_TABLE)) == 3
    torch_trace.record_step_profile(run, trace, context_tokens=1024, arm="plugin")
    assert len(run.rows(torch_trace.STEP_PROFILE_TABLE)) == 6


def test_cli_records_into_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.trace.json.gz")
    run_dir = tmp_path / "run"
    assert torch_trace.main([str(trace), "--run", str(run_dir), "--context-tokens", "2048", "--arm", "stock"]) == 0
    assert "3 rows in" in capsys.readouterr().out
    rows = Run.open(run_dir).rows("step_profile")
    assert {r["context_tokens"] for r in rows} == {2048} and {r["arm"] for r in rows} == {"stock"}
    with pytest.raises(SystemExit):
        torch_trace.main([str(trace), "--run", str(run_dir)])


def test_profile_table_and_plot(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.trace.json.gz")
    a = torch_trace.step_profile_rows(trace, context_tokens=1024, arm="stock")
    a += torch_trace.step_profile_rows(trace, context_tokens=131072, arm="stock")
    b = torch_trace.step_profile_rows(trace, context_tokens=131072, arm="plugin")
    table = view.profile_table({"A": a, "B": b})
    assert [(r["run"], r["arm"], r["context_tokens"]) for r in table] == [
        ("A", "stock", 1024), ("A", "stock", 131072), ("B", "plugin", 131072)]
    r = table[0]
    assert r["steps"] == 2 and r["steps_excluded"] == 1
    assert r["wall_ms"] == pytest.approx(1.0) and r["gpu_busy_ms"] == pytest.approx(0.455)
    assert r["gpu_attn_specdiag_splitkv_ms"] == pytest.approx(0.125)
    assert view.shown_classes(table) == ["attn_specdiag_splitkv", "attn_sglang_triton", "gemm", "norm"]
    cols = view.table_columns(table)
    assert cols["gpu_gemm_ms"] == "GPU gemm (ms)" and "cpu_ngram_draft_ms" in cols and "gpu_memcpy_ms" not in cols
    assert view.profile_table({"A": [], "B": []}) == []
    fig = view.plot_profile(table)
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == ["run A: where a decode step's time goes",
                                               "run B: where a decode step's time goes"]
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["1k", "128k"]
    # 4 classes + idle, one bar per context: the stacked heights of A's first bar add up to its parts
    heights = [p.get_height() for p in axes[0].patches]
    assert len(heights) == 5 * 2
    assert sum(heights[0::2]) == pytest.approx(0.125 + 0.195 + 0.125 + 0.01 + r["gpu_idle_ms"])
    import matplotlib.pyplot as plt

    plt.close(fig)
    m = view.profile_metrics(table)
    assert m[2] == {"run": "B", "arm": "plugin", "context_tokens": 131072, "steps": 2, "wall_ms": pytest.approx(1.0),
                    "gpu_busy_ms": pytest.approx(0.455), "gpu_idle_ms": pytest.approx(0.545),
                    "gpu_attn_specdiag_splitkv_ms": pytest.approx(0.125), "gpu_attn_sglang_triton_ms": pytest.approx(0.195),
                    "gpu_gemm_ms": pytest.approx(0.125), "gpu_norm_ms": pytest.approx(0.01)}
