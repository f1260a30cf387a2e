"""Executing notebooks with papermill into a run folder; how each execution went."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from specdiag.paths import NOTEBOOKS_DIR
from specdiag.report.notebooks import declared_parameters, parameters_for
from specdiag.report.words import in_users_words
from specdiag.runs import Run


@dataclass
class NotebookResult:
    """How one notebook's execution went."""

    notebook: str
    status: str  # "ok" | "failed" | "skipped"
    duration_s: float
    ipynb: str = ""
    html: str = ""
    error: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    recorded_from: str = ""  # the recorded run the notebook showed instead of measuring (its findings are not the run's)


# papermill waits 60 s for a kernel to answer by default; on a 2-core host beside a busy server (a vLLM under load, an
# embedded server decoding) a kernel's start was measured to take longer, and the notebook failed before its first cell.
KERNEL_START_TIMEOUT_S = 300


# The kernel's own log (not the notebook's outputs, which papermill relays and keeps) off the terminal: each kernel
# otherwise warns on start that it "is running over TCP without encryption" (papermill's kernel listens on 127.0.0.1
# only), and at times says "KeyboardInterrupt caught in kernel" when jupyter_client interrupts it to shut it down.
# A cell's error and a dead kernel still fail the notebook (NotebookResult.error).
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=CRITICAL"]


def execute_notebook(notebook: str, run: Run, parameters: Mapping[str, Any],
                     notebooks_dir: Path = NOTEBOOKS_DIR, log_output: bool = True) -> NotebookResult:
    """Execute one notebook with papermill into ``run/notebooks/``; never raises for a cell error."""
    import papermill  # noqa: PLC0415 - loads papermill (costly: ARCHITECTURE.md, Imports)

    out_dir = run.path / "notebooks"
    out_dir.mkdir(exist_ok=True)
    out_path = out_dir / f"{notebook}.ipynb"
    t0 = time.perf_counter()
    status, error = "ok", ""
    try:
        papermill.execute_notebook(
            str(notebooks_dir / f"{notebook}.ipynb"), str(out_path), parameters=dict(parameters),
            kernel_name="python3", cwd=str(notebooks_dir), progress_bar=False, log_output=log_output,
            request_save_on_cell_execute=True, start_timeout=KERNEL_START_TIMEOUT_S, extra_arguments=KERNEL_ARGUMENTS,
        )
    except papermill.PapermillExecutionError as exc:
        status, error = "failed", f"{exc.ename}: {exc.evalue}"
    except Exception as exc:  # noqa: BLE001 - a kernel crash or timeout is a failed notebook, not a crash
        status, error = "failed", f"{type(exc).__name__}: {exc}"
    return NotebookResult(notebook, status, round(time.perf_counter() - t0, 2),
                          ipynb=str(out_path.relative_to(run.path)) if out_path.exists() else "", error=error)


def run_notebooks(notebooks: Sequence[str], run: Run, shared: Mapping[str, Any],
                  params_file: Mapping[str, Any], notebooks_dir: Path = NOTEBOOKS_DIR) -> list[NotebookResult]:
    """Validate every notebook's parameters first, then execute them in order."""
    plans = []
    for nb_name in notebooks:
        declared = declared_parameters(notebooks_dir / f"{nb_name}.ipynb")
        plans.append((nb_name, parameters_for(nb_name, declared, shared, params_file)))
    results = []
    for i, (nb_name, params) in enumerate(plans, 1):
        print(f"[specdiag] ({i}/{len(plans)}) {nb_name} ...", flush=True)
        res = execute_notebook(nb_name, run, params, notebooks_dir)
        print(f"[specdiag] ({i}/{len(plans)}) {nb_name}: {res.status} in {res.duration_s:.1f} s"
              + (f" ({in_users_words(res.error)})" if res.error else ""), flush=True)
        results.append(res)
    return results
