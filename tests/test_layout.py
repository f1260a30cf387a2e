"""The layout: replay code imports no server client, and every notebook has its step package.

- Replay: importing any module of ``specdiag.steps`` or ``specdiag.measure`` (what a notebook imports to
  replay a recorded run) must not import an HTTP client (``requests``), a serving client, the embedded
  server or a launcher; those are imported inside the functions that measure, the one kind of import a module keeps
  out of its top besides a measured cost (docs/ARCHITECTURE.md, Imports), each with its reason beside it. Checked in a
  fresh interpreter, one module at a time, so the first module that pulls one in is named.
- Which way imports point (steps are leaves, the base imports no step, ...): ``tests/test_import_graph.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_import_graph import LIB

SERVER_MODULES = ("requests", "specdiag.serving.http", "specdiag.serving.clients", "specdiag.serving.sglang",
                  "specdiag.serving.vllm", "specdiag.localserver", "specdiag.launchers")


def _modules(package: str) -> list[str]:
    root = LIB / package.replace(".", "/")
    names = []
    for p in sorted(root.rglob("*.py")):
        if p.name == "__main__.py":  # a command (python -m ...), not a module to import
            continue
        parts = p.relative_to(LIB.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def replay_modules() -> list[str]:
    return _modules("steps") + _modules("measure") + ["specdiag.runs", "specdiag.nb", "specdiag.telemetry.sampler"]


def test_replay_modules_import_no_server_client() -> None:
    code = (
        "import importlib, json, sys\n"
        f"server = {SERVER_MODULES!r}\n"
        "found = {}\n"
        f"for m in {replay_modules()!r}:\n"
        "    importlib.import_module(m)\n"
        "    hit = sorted(s for s in sys.modules for p in server if s == p or s.startswith(p + '.'))\n"
        "    if hit:\n"
        "        found[m] = hit\n"
        "        break\n"
        "print(json.dumps(found))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert not found, f"importing these modules pulls in server code (move the import into the function): {found}"


def test_the_replay_check_sees_a_server_import() -> None:
    """The check above can fail: specdiag.serving's clients do import requests."""
    code = "import sys, specdiag.serving.clients; print('requests' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr[-2000:]


def test_each_notebook_has_its_step() -> None:
    steps = {p.name for p in (LIB / "steps").iterdir() if (p / "__init__.py").exists()}
    notebooks = {p.stem.split("_", 1)[1] for p in (Path(__file__).parents[1] / "notebooks").glob("*.ipynb")}
    # 08_compare_runs shares 07's step (findings); every step has its notebook
    assert notebooks - steps == {"compare_runs"}, notebooks - steps
    assert steps - notebooks == set(), steps - notebooks
