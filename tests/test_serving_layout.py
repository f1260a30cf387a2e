"""The serving package's base modules stand alone: server errors, redaction and SSE parsing import nothing
else of the library (so any engine client, script or test can use them without the rest)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVING = Path(__file__).parents[1] / "lib" / "specdiag" / "serving"
ALLOWED = {"errors.py": {"specdiag.serving.redaction"}, "redaction.py": set(), "sse.py": set()}


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_base_modules_import_nothing_else_of_the_library(name: str) -> None:
    tree = ast.parse((SERVING / name).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    ours = {m for m in imported if m.startswith("specdiag")}
    assert ours <= ALLOWED[name], ours - ALLOWED[name]


def test_no_module_left_at_the_old_client_paths() -> None:
    lib = SERVING.parent
    assert not any((lib / f).exists() for f in ("client.py", "sse.py", "trace.py"))
