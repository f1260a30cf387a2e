"""Notebook 06 on the CPU: the torch implementations on a tiny grid, then the recorded H200 run replayed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
import torch

from specdiag.paths import REFERENCE_DIR

H200 = REFERENCE_DIR / "kernel-ab-h200"


@pytest.mark.notebook
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU host the notebook measures; this test is the CPU replay")
def test_06_replays_the_h200_run_on_cpu(run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    out = run_notebook("06_kernel_ab")
    run_dir = tmp_path / "run"
    res = json.loads((run_dir / "findings" / "06_kernel_ab.json").read_text())
    m = res["metrics"]
    assert Path(m["source_dir"]).resolve() == H200.resolve()
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
