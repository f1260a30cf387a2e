"""Committed notebooks follow the skeleton: kernelspec python3, no outputs, one parameters cell
with the shared parameters first, and a last cell that writes the notebook's result."""

from __future__ import annotations

import json

import pytest

from specdiag.paths import NOTEBOOKS_DIR

NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
SHARED = ["server_url", "run_dir", "replay_dir"]


def test_there_are_notebooks() -> None:
    assert any(p.stem == "01_baseline_sweep" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_skeleton(path) -> None:
    nb = json.loads(path.read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    cells = nb["cells"]
    assert cells[0]["cell_type"] == "markdown" and "".join(cells[0]["source"]).lstrip().startswith("#")
    for cell in cells:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs"), f"{path.name}: committed with outputs (strip them)"
            assert cell.get("execution_count") is None, f"{path.name}: committed with execution counts"
    params = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, f"{path.name}: needs exactly one cell tagged 'parameters'"
    lines = [ln for ln in "".join(params[0]["source"]).splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    names = [ln.split(":")[0].split("=")[0].strip() for ln in lines]
    if path.stem != "08_compare_runs":
        assert names[:3] == SHARED, f"{path.name}: shared parameters first, got {names[:3]}"
    for ln in lines:
        assert "#" in ln, f"{path.name}: parameter line without a help comment: {ln!r}"
    last_code = [c for c in cells if c["cell_type"] == "code"][-1]
    assert "write_result" in "".join(last_code["source"]), f"{path.name}: last code cell must write the result"
