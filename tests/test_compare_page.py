"""Unit tests of specdiag.steps.findings.compare_page (08's sections) on synthetic runs, without a kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdiag import nb
from specdiag.findings import Finding
from specdiag.runs import Run
from specdiag.steps.findings import compare_page as page


def _run(path: Path, decode: dict[int, float], step: dict[int, float], severity: str, backend: str) -> Run:
    run = Run.create(path, server={"speculative_algorithm": "NGRAM", "attention_backend": backend, "page_size": 1})
    for c, speed in decode.items():
        for repeat in range(3):
            run.append_row("sweep", {"context_tokens": c, "repeat": repeat, "prompt_kind": "novel", "seed": 0,
                                     "max_new_tokens": 9, "decode_tok_s": speed, "step_ms": step[c],
                                     "completion_tokens": 9, "verify_steps": 4, "ttft_s": 0.1, "error": None})
    run.write_result("01_baseline_sweep", findings=[
        Finding("sweep.decode_collapse", "Decode speed vs context", "falls", severity, ("e",), {}, "measured")],
        metrics={})
    return run


def test_start_needs_both_runs(tmp_path: Path) -> None:
    with pytest.raises(nb.ParameterError, match="run_a and run_b must both name run folders"):
        page.start({"run_a": str(tmp_path), "run_b": "", "run_dir": str(tmp_path / "cmp")})


def test_sections_compare_two_runs(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    a = _run(tmp_path / "a", {1000: 100.0, 4000: 10.0}, {1000: 10.0, 4000: 100.0}, "critical", "triton")
    b = _run(tmp_path / "b", {1000: 120.0, 4000: 40.0}, {1000: 8.0, 4000: 25.0}, "warning", "flashinfer")
    pg = page.start({"run_a": str(a.path), "run_b": str(b.path), "run_dir": str(tmp_path / "cmp")})
    assert pg.opening.lines[0].startswith(f"A = {a.path}")
    assert [k for k, _ in page.about(pg).parts] == ["table"]
    sweeps = page.sweeps(pg)
    assert [k for k, _ in sweeps.parts] == ["text", "table", "figure"]
    assert [r["context_tokens"] for r in pg.sweep_cmp] == [1000, 4000]
    assert page.commit_lengths(pg).lines == []  # the sweep rows carry commit lengths: a table, no text
    assert page.step_profiles(pg).lines[0].startswith("no step profile in either run")
    verdicts = page.verdicts(pg)
    found = {f.id: f for f in verdicts["found"]}
    assert found["compare.verdicts"].numbers == {"changed": 1, "findings": 1}
    m = page.metrics(pg)
    assert m["decode_ratio_b_a"] == pytest.approx([1.2, 4.0]) and m["findings_changed"] == 1
    assert m["step_profile"] == []
