"""The layout: replay code imports no server client, and every notebook has its step package.

- Replay: importing any module of ``specdiag.steps`` or ``specdiag.measure`` (what a notebook imports to
  replay a recorded run) must not import an HTTP client (``requests``), a serving client, the embedded
  server or a launcher; those are imported inside the functions that measure, the one kind of import a module keeps
  out of its top besides a measured cost (docs/ARCHITECTURE.md, Imports), each with its reason beside it. Checked in a
  fresh interpreter, one module at a time, so the first module that pulls one in is named.
- Which way imports point (steps are leaves, the base imports no step, ...): ``tests/test_import_graph.py``.
"""

from __future__ import annotations

import ast
import json
import re
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


#: Parts of the library whose imports inside functions are not yet held to the rule below: a command's (its verbs
#: import what they run), a server's, a kernel's. The list only shrinks: a part whose every such import names its
#: reason leaves it (the second test fails until it does).
NOT_YET = ("cli.py", "report/cli.py", "report/commands.py", "sweep/", "launchers/", "localserver/", "kernels/",
           "process.py")
REASON = re.compile(r"#\s*noqa:[A-Z0-9, ]*PLC0415\s*-\s*\S")


def _imports_inside_functions(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every import inside a function of ``path``, its last line (where the comment goes)."""
    src = path.read_text(encoding="utf-8")
    lines = src.splitlines()
    out = []
    for fn in ast.walk(ast.parse(src)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out += [(n.lineno, lines[n.end_lineno - 1]) for n in ast.walk(fn)
                    if isinstance(n, (ast.Import, ast.ImportFrom))]
    return sorted(set(out))


def _reasonless(path: Path) -> list[str]:
    return [f"{path.relative_to(LIB)}:{ln}: {text.strip()}" for ln, text in _imports_inside_functions(path)
            if not REASON.search(text)]


def test_an_import_inside_a_function_names_its_reason() -> None:
    """A module's imports sit at its top; one inside a function says why beside it (docs/ARCHITECTURE.md, Imports):
    replay loads no server code, the package is costly and the module does not load it otherwise, or it is optional."""
    found = [r for p in sorted(LIB.rglob("*.py")) if not str(p.relative_to(LIB)).startswith(NOT_YET)
             for r in _reasonless(p)]
    assert not found, "imports inside functions without a reason (move them to the module's top, or say why):\n" + \
        "\n".join(found)


def test_the_parts_not_yet_held_to_the_rule_still_need_the_exemption() -> None:
    """The exemption list only shrinks: each part on it still has an import inside a function without a reason."""
    for part in NOT_YET:
        paths = [LIB / part] if part.endswith(".py") else sorted((LIB / part).rglob("*.py"))
        assert any(_reasonless(p) for p in paths), f"{part} keeps the rule now: drop it from NOT_YET"


def test_the_reason_check_sees_an_import_without_one(tmp_path: Path) -> None:
    """The check above can fail: an import inside a function with a bare noqa has no reason; one with a reason has."""
    (tmp_path / "m.py").write_text("def f():\n    import json  # noqa: PLC0415\n\n\ndef g():\n"
                                   "    import torch  # noqa: PLC0415 - loads torch (costly)\n")
    bad = [text for _, text in _imports_inside_functions(tmp_path / "m.py") if not REASON.search(text)]
    assert bad == ["    import json  # noqa: PLC0415"]
