"""Notebooks are parameters, calls and prose: at most MAX_LINES non-blank code lines a notebook and MAX_CELL_LINES a
code cell (a section's work is a library call, ``steps/<step>/page.py``), and every parameter checked against its
parameters cell's annotation (``nb.check_parameters(globals())``) in the cell right after it, before anything starts
a server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdiag.paths import NOTEBOOKS_DIR

MAX_LINES = 150
MAX_CELL_LINES = 25
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))


def _code_cells(path: Path) -> list[list[str]]:
    cells = json.loads(path.read_text())["cells"]
    return [[ln for ln in "".join(c["source"]).splitlines() if ln.strip()] for c in cells if c["cell_type"] == "code"]


def size_problems(path: Path) -> list[str]:
    """What breaks the size limits in one notebook, each naming the notebook (and the cell: its index among the
    notebook's code cells and its first line)."""
    cells = _code_cells(path)
    total = sum(len(c) for c in cells)
    out = [f"{path.stem}: {total} non-blank code lines (at most {MAX_LINES})"] if total > MAX_LINES else []
    out += [f"{path.stem}: code cell {i} ({c[0].strip()[:60]!r}...) has {len(c)} non-blank lines (at most "
            f"{MAX_CELL_LINES})" for i, c in enumerate(cells) if len(c) > MAX_CELL_LINES]
    return out


def _params(path: Path) -> pytest.param:
    return pytest.param(path, id=path.stem)


@pytest.mark.parametrize("path", [_params(p) for p in NOTEBOOKS])
def test_notebook_is_parameters_calls_and_prose(path: Path) -> None:
    problems = size_problems(path)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", [_params(p) for p in NOTEBOOKS])
def test_parameters_are_checked_from_their_annotations_right_after_the_parameters_cell(path: Path) -> None:
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    i = next(k for k, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    params = [ln for ln in "".join(cells[i]["source"]).splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    unannotated = [ln for ln in params if ":" not in ln.split("=")[0]]
    assert not unannotated, f"{path.stem}: parameters without an annotation: {unannotated}"
    bare = [ln.split(":")[0].strip() for ln in params if ln.split("=")[0].split(":")[1].strip() == "list"]
    assert not bare, f"{path.stem}: say what a list holds (list[int], list[str]): {bare}"
    first = [ln for ln in "".join(cells[i + 1]["source"]).splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert "nb.check_parameters(globals())" in first[0], \
        f"{path.stem}: the cell after the parameters cell must start with nb.check_parameters(globals()); got {first[0]!r}"


def test_the_size_check_names_the_offender(tmp_path: Path) -> None:
    cell = {"cell_type": "code", "metadata": {}, "source": ["x = 1\n"] * 26}
    book = tmp_path / "99_big.ipynb"
    book.write_text(json.dumps({"cells": [cell] * 6}))
    assert size_problems(book) == ["99_big: 156 non-blank code lines (at most 150)"] + [
        f"99_big: code cell {i} ('x = 1'...) has 26 non-blank lines (at most 25)" for i in range(6)]
