"""data/reference/README.md indexes every recorded run, one table line each, and every run it names is there and opens
as a run folder. Cheap: reads the index, each run.json and the params files, nothing else."""

from __future__ import annotations

import re

import pytest

from specdiag.paths import PARAMS_DIR, PROJECT_ROOT, REFERENCE_DIR
from specdiag.runs import Run

INDEX = REFERENCE_DIR / "README.md"
COLUMNS = ["run", "what it shows", "hardware", "engine, version", "model", "replays"]
MAX_RUNS = 20


def _table() -> tuple[list[str], list[list[str]]]:
    lines = [ln.strip() for ln in INDEX.read_text().splitlines() if ln.strip().startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    header, rows = cells[0], [r for r in cells[2:]]
    return header, rows


def _indexed() -> list[str]:
    names = []
    for row in _table()[1]:
        m = re.fullmatch(r"`([^`/]+)`", row[0])
        if m:
            names.append(m.group(1))
    return names


def _folders() -> list[str]:
    return sorted(p.name for p in REFERENCE_DIR.iterdir() if p.is_dir())


def test_the_index_has_one_full_line_per_run() -> None:
    header, rows = _table()
    assert header == COLUMNS
    names = _indexed()
    assert len(names) == len(set(names)), "a run is listed twice"
    for row in rows:
        assert len(row) == len(COLUMNS), row
        if row[0].startswith("`"):
            assert all(row), f"{row[0]}: every column says something"
    unnamed = [r[0] for r in rows if not r[0].startswith("`")]
    assert not unnamed, f"lines that name no run folder: {unnamed}"


def test_every_folder_is_indexed_and_every_indexed_run_is_there() -> None:
    indexed, folders = set(_indexed()), set(_folders())
    assert not indexed - folders, f"the index names runs that are not in data/reference: {sorted(indexed - folders)}"
    missing = folders - indexed
    assert not missing, f"folders under data/reference missing from its README.md: {sorted(missing)}"
    assert len(indexed) <= MAX_RUNS


@pytest.mark.parametrize("name", _indexed())
def test_each_run_opens_and_says_where_it_came_from(name: str) -> None:
    run = Run.open(REFERENCE_DIR / name)
    assert isinstance(run.meta, dict) and run.meta, f"{name}/run.json is empty"
    assert list(run.path.glob("*.jsonl")), f"{name} holds no table"
    readme = REFERENCE_DIR / name / "README.md"
    assert readme.exists() and readme.read_text().startswith(f"# {name}"), f"{name}/README.md: its provenance, titled"


def test_params_files_name_runs_that_exist() -> None:
    pattern = r"data/reference/([\w.-]+(?:/[\w.-]+)?)"
    named = {m for p in PARAMS_DIR.glob("*.yaml") for m in re.findall(pattern, p.read_text())}
    assert named, "params/compare-plugin*.yaml and plugin-projection.yaml name reference runs"
    for ref in sorted(named):
        assert (PROJECT_ROOT / "data" / "reference" / ref / "run.json").exists(), f"params name data/reference/{ref}"
