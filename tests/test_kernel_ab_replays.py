"""Every committed kernel A/B run folder (data/reference/kernel-ab-h200-run*) replays through 06 on the CPU: the
notebook runs to the end and its findings name the folder. Runs whose kernels have no fixed-cost fit (split_p1
absent, or one context per shape: runs 15-24 of issue 13) once stopped 06 with a KeyError; the detailed numbers of
single runs are checked in tests/test_kernel_ab_notebook.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

from specdiag.kernels.analysis import fixed_cost_fit

REFERENCE_DIR = Path(__file__).resolve().parents[1] / "data" / "reference"
RUNS = sorted(p.name for p in REFERENCE_DIR.glob("kernel-ab-h200-run*") if (p / "kernel_ab.jsonl").exists())


def test_fixed_cost_fit_keeps_its_columns_when_nothing_fits() -> None:
    one_context = pd.DataFrame({"kernel": ["split_gwf_p1"], "layout": ["shuffled_p1"], "heads": [8],
                                "draft_tokens": [8], "context_tokens": [131072], "kv_bytes": [151e6],
                                "ms_median": [0.066]})
    for df, kernel in ((one_context, "split_p1"), (one_context, "split_gwf_p1")):
        fit = fixed_cost_fit(df, kernel=kernel)
        assert fit.empty and {"fixed_us", "marginal_gbps", "marginal_tflops"} <= set(fit.columns)


def test_the_session_6_runs_are_all_here() -> None:
    assert {f"kernel-ab-h200-run{n}" for n in (15, 16, 17, 18, 19, 20, 21, 22, 24)} <= set(RUNS)


@pytest.mark.parametrize("run", RUNS)
def test_06_replays_every_committed_kernel_ab_run(run: str, run_notebook: Callable[..., Path], tmp_path: Path) -> None:
    run_notebook("06_kernel_ab", replay_dir=str(REFERENCE_DIR / run), cpu_smoke=False)
    res = json.loads((tmp_path / "run" / "findings" / "06_kernel_ab.json").read_text())
    assert res["metrics"]["source_dir"] == f"data/reference/{run}"
    assert res["findings"], run
