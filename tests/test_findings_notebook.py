"""Execute notebooks/07_findings.ipynb and 08_compare_runs.ipynb on synthetic run folders (no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdiag.findings import Finding
from specdiag.runs import Run
from specdiag.telemetry.torch_trace import record_step_profile
from test_bandwidth_notebook import assert_tables_formatted
from test_step_profile import write_trace

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
    diagnosis, overall, *run_level = result["findings"]
    assert {f["id"] for f in run_level} <= {"findings.ddtree"}  # the run's servers speculated: what it shows of DDTree
    assert diagnosis["id"] == "findings.diagnosis" and overall["id"] == "findings.overall"
    assert overall["severity"] == "critical"
    assert result["metrics"]["notebooks"] == ["00_snapshot", "01_baseline_sweep"]
    assert "02_gpu_utilization" in result["metrics"]["missing"]
    assert "Decode speed vs context" in overall["verdict"]


def _html_outputs(executed: Path) -> list[str]:
    """The HTML (else text) of every output, in page order."""
    out = []
    for cell in json.loads(executed.read_text())["cells"]:
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            out.append("".join(data.get("text/html", "")) or "".join(o.get("text", "")))
    return out


def test_the_page_opens_with_the_diagnosis_orders_by_severity_and_keeps_a_recorded_run_apart(
        run_notebook, tmp_path: Path) -> None:
    """What a reader sees: the diagnosis paragraph first, built from this run's numbers; findings most severe first
    across notebooks (01's critical before 00's info, whatever the notebook order); 06's findings, replayed from a
    recorded kernel run, in their own collapsed section labelled with that run and out of the counts."""
    run = Run.create(tmp_path / "run", server_url="http://127.0.0.1:1")
    run.write_result("00_snapshot", findings=[Finding("snapshot.speculation", "Speculative decoding is on", "STANDALONE",
                                                      "info")])
    run.write_result("01_baseline_sweep", findings=[
        Finding("sweep.step_time_slope", "Step time vs context", "grows", "warning", ("e",),
                {"step_ms_first": 9.5, "step_ms_last": 1430.0, "context_tokens_first": 1024,
                 "context_tokens_last": 185000}),
        Finding("sweep.decode_collapse", "Decode speed vs context", "falls 41x", "critical", ("e",),
                {"decode_collapse_x": 41.2, "decode_tok_s_first": 82.4, "decode_tok_s_last": 2.0,
                 "context_tokens_first": 1024, "context_tokens_last": 185000})],
        metrics={"step_ms": [9.512345678901234, 1430.123456789012]})
    run.write_result("05_bandwidth_analysis", findings=[
        Finding("bandwidth.far_from_floor", "Measured step vs the memory floor", "far", "critical", ("e",),
                {"context_tokens": 185000, "measured_ms": 1430.0, "floor_ms": 12.34, "measured_over_floor_x": 115.9,
                 "pct_of_peak_total": 0.86, "peak_gb_s": 4800.0}, "computed")])
    run.write_result("06_kernel_ab", findings=[
        Finding("kernel_ab.baseline_starves", "The baseline kernel starves the GPU", "recorded verdict", "critical",
                tuple(f"case {i}" for i in range(50)))], recorded_from="data/reference/kernel-ab-h200")
    executed = run_notebook("07_findings", run_dir=str(run.path))
    shown = _html_outputs(executed)
    lead, first = shown[0], shown[1]
    assert 'class="specdiag-lead"' in lead, f"the page does not open with its answer: {lead[:200]}"
    assert "decode falls 41.2x from 1k tokens to 185k tokens (82.4 to 2 tokens/s); the step is 116x its floor" in lead
    assert 'class="specdiag-diagnosis"' in first, f"the answer is not followed by the diagnosis: {first[:200]}"
    assert "Decode falls 41.2x with context, from 82.4 tokens/s at 1k tokens to 2 at 185k tokens" in first
    assert "116x its memory floor of 12.3 ms" in first
    assert "This run: 2 critical, 1 warning" in first and "data/reference/kernel-ab-h200" in first
    lines = dict(json.loads((run.path / "findings" / "07_findings.json").read_text())["metrics"]["lead"])
    assert list(lines) == ["Symptom", "Cause", "Run", "Buys", "How sure"] and lines["Buys"].startswith("not measured")
    cards = next(h for h in shown if "specdiag-finding" in h and "specdiag-recorded" not in h)
    order = [cards.index(i) for i in ("sweep.decode_collapse", "bandwidth.far_from_floor", "sweep.step_time_slope",
                                      "snapshot.speculation")]
    assert order == sorted(order), "findings are not ordered by severity across notebooks"
    assert "kernel_ab.baseline_starves" not in cards
    recorded = next(h for h in shown if "specdiag-recorded" in h)
    assert recorded.lstrip().startswith("<details") and "<summary" in recorded
    assert "findings of the recorded run <code>data/reference/kernel-ab-h200</code>" in recorded
    assert "kernel_ab.baseline_starves" in recorded and "evidence (50 lines)</summary>" in recorded
    page = "\n".join(shown)
    assert "9.512345678901234" not in page and "[9.51, 1,430]" in page  # numbers rounded to what they mean
    assert_tables_formatted("07_findings", page)
    assert page.index("specdiag-diagnosis") < page.index("specdiag-finding")
    result = json.loads((run.path / "findings" / "07_findings.json").read_text())
    overall = result["findings"][1]
    assert overall["numbers"]["critical_findings"] == 2 and overall["numbers"]["recorded"] == {
        "06_kernel_ab": "data/reference/kernel-ab-h200"}
    assert "06_kernel_ab" not in result["metrics"]["diagnosis_based_on"][0]
    assert all("06_kernel_ab" not in b for b in result["metrics"]["diagnosis_based_on"])


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
    assert result["metrics"]["step_profile"] == []
    assert "no step profile in either run" in _outputs(tmp_path / "08_compare_runs.out.ipynb")


def _outputs(executed: Path) -> str:
    """Every text and HTML output of an executed notebook, joined; '[image]' for each picture."""
    texts = []
    for cell in json.loads(executed.read_text())["cells"]:
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            texts.append("".join(o.get("text", "")) + "".join(data.get("text/markdown", ""))
                         + "".join(data.get("text/html", "")) + ("[image]" if "image/png" in data else ""))
    return "\n".join(texts)


def test_compare_shows_step_profiles(run_notebook, tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", {1000: 100.0}, {1000: 10.0}, "critical")
    b = make_run(tmp_path / "b", {1000: 120.0}, {1000: 8.0}, "warning")
    trace = write_trace(tmp_path / "t.trace.json.gz")
    for ctx in (1024, 131072):
        record_step_profile(a, trace, context_tokens=ctx, arm="stock")
    record_step_profile(b, trace, context_tokens=131072, arm="plugin")
    out = tmp_path / "cmp"
    executed = run_notebook("08_compare_runs", run_a=str(a.path), run_b=str(b.path), run_dir=str(out))
    metrics = json.loads((out / "findings" / "08_compare_runs.json").read_text())["metrics"]
    bars = metrics["step_profile"]
    assert [(m["run"], m["arm"], m["context_tokens"], m["steps"]) for m in bars] == [
        ("A", "stock", 1024, 2), ("A", "stock", 131072, 2), ("B", "plugin", 131072, 2)]
    assert bars[0]["wall_ms"] == pytest.approx(1.0) and bars[0]["gpu_busy_ms"] == pytest.approx(0.455)
    assert bars[2]["gpu_attn_specdiag_splitkv_ms"] == pytest.approx(0.125)
    shown = _outputs(executed)
    assert "Where a decode step's time goes" in shown and "GPU attn_specdiag_splitkv (ms)" in shown
    assert "[image]" in shown and "no step profile" not in shown
