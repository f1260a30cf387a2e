"""Notebook 06 on the CPU: the torch implementations on a tiny grid, then the recorded H200 run replayed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
import torch

from specdiag.paths import PROJECT_ROOT, REFERENCE_DIR

H200 = REFERENCE_DIR / "kernel-ab-h200"


@pytest.mark.notebook
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU host the notebook measures; this test is the CPU replay")
def test_06_replays_the_h200_run_on_cpu(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    out = run_notebook("06_kernel_ab")
    run_dir = tmp_path / "run"
    res = json.loads((run_dir / "findings" / "06_kernel_ab.json").read_text())
    m = res["metrics"]
    assert m["source_dir"] == "data/reference/kernel-ab-h200"  # project-relative: shared pages
    assert m["gpu"].startswith("NVIDIA H200") and m["cases"] > 300
    assert m["speedup_128k_h8_t8_min"] >= 20
    assert set(m["targets"]) == {"memory: >= 85% of copy bandwidth (H*T <= 64)",
                                 "compute: >= 50% of bf16 matmul (H*T >= 256)",
                                 "page_size 1 within 10% of 64-token blocks",
                                 "split-KV >= 20x baseline (128k, h8, T8)"}
    ids = {f["id"] for f in res["findings"]}
    assert "kernel_ab.baseline_starves" in ids
    # the CPU smoke grid ran the torch implementations into this run's own table, all correct
    cpu_rows = [json.loads(line) for line in (run_dir / "kernel_ab.jsonl").read_text().splitlines()]
    assert cpu_rows and all(r["impl"] == "torch" and r["correct"] for r in cpu_rows)
    assert "% of copy" in out.read_text()


@pytest.mark.notebook
def test_06_names_a_bad_parameter(run_notebook: Callable[..., Path]) -> None:
    import papermill

    with pytest.raises(papermill.PapermillExecutionError, match="grid must be"):
        run_notebook("06_kernel_ab", replay_dir=str(H200), grid="huge")


@pytest.mark.gpu
@pytest.mark.notebook
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run `make test-gpu` on a GPU host)")
def test_06_measures_on_cuda(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    """Notebook 06's measuring path: peaks, the Triton kernels on the smoke grid, the analysis of its own rows."""
    from specdiag.runs import Run

    run_dir = tmp_path / "run"
    run_notebook("06_kernel_ab", run_dir=str(run_dir), grid="smoke", tune=False)
    res = json.loads((run_dir / "findings" / "06_kernel_ab.json").read_text())
    m = res["metrics"]
    assert (PROJECT_ROOT / m["source_dir"]).resolve() == run_dir.resolve()  # analysed what it measured, not the reference
    assert m["gpu"] == torch.cuda.get_device_name()
    assert m["copy_gbps"] > 0 and m["matmul_tflops"] > 0
    rows = Run.open(run_dir).rows("kernel_ab")
    timed = [r for r in rows if r.get("kernel") and not r.get("skipped")]
    assert timed and all(r["impl"] == "triton" and r["correct"] and r["error"] is None for r in timed)
    assert m["cases"] == len(timed)
    assert {r["kernel"] for r in timed} == {"baseline_p1", "split_p1", "split_b64"}
    found = {f["id"]: f for f in res["findings"]}
    base = found["kernel_ab.baseline_starves"]
    assert base["numbers"]["copy_gbps"] == pytest.approx(m["copy_gbps"])
    from specdiag.kernels.analysis import BASELINE_CRITICAL_PCT, BASELINE_WARNING_PCT

    pct = base["numbers"]["baseline_pct_copy_max"]
    assert base["severity"] == ("critical" if pct < BASELINE_CRITICAL_PCT else
                                "warning" if pct < BASELINE_WARNING_PCT else "ok")
