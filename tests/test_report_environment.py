"""A Jupyter stack installed with ``pip install --target`` (a GPU host's site folder) still renders: its share/ is searched."""

from __future__ import annotations

import importlib.machinery
import os
from pathlib import Path

import pytest

from specdiag.report import environment


def _fake_target(tmp_path: Path, templates: bool) -> importlib.machinery.ModuleSpec:
    pkg = tmp_path / "site" / "nbconvert"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    if templates:
        (tmp_path / "site" / "share" / "jupyter" / "nbconvert" / "templates" / "lab").mkdir(parents=True)
    return importlib.machinery.ModuleSpec("nbconvert", None, origin=str(pkg / "__init__.py"))


def test_target_install_share_dir_goes_on_jupyter_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _fake_target(tmp_path, templates=True)
    monkeypatch.setattr(environment.importlib.util, "find_spec", lambda name: spec)
    monkeypatch.setenv("JUPYTER_PATH", "/somewhere/else")
    env = environment.local_jupyter_env(tmp_path / "state")
    share = str((tmp_path / "site" / "share" / "jupyter").resolve())
    assert env["JUPYTER_PATH"].split(os.pathsep) == ["/somewhere/else", share]


def test_an_environment_install_leaves_jupyter_path_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _fake_target(tmp_path, templates=False)
    monkeypatch.setattr(environment.importlib.util, "find_spec", lambda name: spec)
    monkeypatch.delenv("JUPYTER_PATH", raising=False)
    assert "JUPYTER_PATH" not in environment.local_jupyter_env(tmp_path / "state")


def test_render_again_turns_a_page_that_failed_to_render_into_ok(tmp_path: Path) -> None:
    import json

    import nbformat

    from specdiag.report.cli import main

    run = tmp_path / "run"
    (run / "notebooks").mkdir(parents=True)
    for name in ("00_snapshot", "01_baseline_sweep"):
        nbformat.write(nbformat.v4.new_notebook(), run / "notebooks" / f"{name}.ipynb")
    results = [{"notebook": "00_snapshot", "status": "failed", "duration_s": 11.9,
                "error": "HTML rendering failed: No template sub-directory with name 'lab' found"},
               {"notebook": "01_baseline_sweep", "status": "failed", "duration_s": 2.0,
                "error": "ServerError: the server went away"}]
    (run / "run.json").write_text(json.dumps({"run_id": "t", "report": {
        "statuses": {r["notebook"]: "failed" for r in results}, "results": results}}))
    assert main(["render", "--run-dir", str(run)]) == 0
    report = json.loads((run / "run.json").read_text())["report"]
    assert report["statuses"] == {"00_snapshot": "ok", "01_baseline_sweep": "failed"}
    assert (run / "html" / "00_snapshot.html").is_file()
