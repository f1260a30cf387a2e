"""The library's modules import each other without loops (lazy imports inside functions count too)."""

from __future__ import annotations

import ast
from pathlib import Path

import specdiag

LIB = Path(specdiag.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(LIB.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the specdiag modules it imports (packages resolved to their __init__)."""
    modules = {_module_name(p): p for p in LIB.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t in modules and t != mod and not mod.startswith(t + "."):  # a package's own __init__ is not a loop
                    graph[mod].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    out, state, stack = [], {}, []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                out.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return out


def test_no_import_loops() -> None:
    found = cycles(import_graph())
    assert not found, "import loops: " + "; ".join(" -> ".join(c) for c in found)


def test_the_two_former_loops_stay_cut() -> None:
    g = import_graph()
    assert "specdiag.telemetry.sampler" not in g["specdiag.telemetry.nvml"]
    assert "specdiag.telemetry.sampler" not in g["specdiag.telemetry.prometheus"]
