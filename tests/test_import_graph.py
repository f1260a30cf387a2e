"""The library's and the plugin's imports: no loops, and the layering below (lazy imports inside functions count too)."""

from __future__ import annotations

import ast
from pathlib import Path

import specdiag
import specdiag_sglang_plugin

LIB = Path(specdiag.__file__).parent
PLUGIN = Path(specdiag_sglang_plugin.__file__).parent
#: the packages read: the library and the SGLang plugin (which imports the library, never the other way)
ROOTS = (LIB, PLUGIN)

#: What is not the base: the steps and the top that runs them (the console script, the report). The sweep (`specdiag
#: sweep`, 09 and 10 in-process) is below the steps: it runs a measurement it is given by name.
NOT_BASE = ("steps", "report", "cli")

#: The layering, one rule a row: (importer, what it never imports, why). Places are paths under specdiag/ written
#: with dots; "base" is every module outside NOT_BASE; "steps.X" and "steps.Y" are two different step packages.
LAYERING: tuple[tuple[str, str, str], ...] = (
    ("steps.X", "steps.Y", "a step is a leaf: what two steps share moves down to the base"),
    ("base", "steps", "the base serves every step and names none"),
    ("base", "report", "the report runs notebooks and renders pages; nothing it runs calls back into it"),
    ("steps", "report", "the report runs notebooks and renders pages; nothing it runs calls back into it"),
    ("report", "steps", "the report runs notebooks by name and renders what they wrote; it imports no step"),
    ("cli", "steps", "the console script hands its verbs to the report and the sweep, which run steps by name"),
    ("localserver", "launchers", "the embedded server starts its process with specdiag.process, not the registry"),
    ("specdiag", "plugin", "the plugin runs inside SGLang and imports the library; the library never needs it"),
)


def _module_name(path: Path, root: Path = LIB) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(tree: ast.AST, module: str, is_package: bool = False) -> set[str]:
    """Every dotted name ``module``'s source imports, wherever the import sits: ``import a.b``, ``from a import b``
    (both ``a`` and ``a.b``: b may be a module), relative imports resolved, ``importlib.import_module("a.b")``."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            out |= {name} | {f"{name}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"):
            out.add(node.args[0].value)
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of the library and the plugin it imports (packages resolved to their __init__)."""
    paths = {_module_name(p, root): p for root in ROOTS for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in paths.items():
        names = imported_names(ast.parse(path.read_text()), mod, path.name == "__init__.py")
        # a package's own __init__ is not a loop
        graph[mod] = {t for t in names if t in paths and t != mod and not mod.startswith(t + ".")}
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


def _place(module: str) -> list[str]:
    """specdiag.steps.kernel_ab.plots -> ['steps', 'kernel_ab', 'plots']; the plugin's modules lie outside the
    library (specdiag_sglang_plugin.hook -> ['plugin'])."""
    return ["plugin"] if module.split(".")[0] == specdiag_sglang_plugin.__name__ else module.split(".")[1:]


def _step(module: str) -> str | None:
    """The step package a module lies in (specdiag.steps.X...), or None."""
    p = _place(module)
    return p[1] if len(p) >= 2 and p[0] == "steps" else None


def _in(module: str, place: str) -> bool:
    p = _place(module)
    if place == "specdiag":  # anywhere in the library
        return p != ["plugin"]
    if place == "plugin":
        return p == ["plugin"]
    if place == "base":
        return not p or p[0] not in NOT_BASE + ("plugin",)
    return p[:len(place.split("."))] == place.split(".")


def breaks(rule: tuple[str, str, str], importer: str, imported: str) -> bool:
    """Whether ``importer`` importing ``imported`` breaks one row of :data:`LAYERING`."""
    source, target, _ = rule
    if (source, target) == ("steps.X", "steps.Y"):
        a, b = _step(importer), _step(imported)
        return a is not None and b is not None and a != b
    return _in(importer, source) and _in(imported, target)


def layering_breaks(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {t} ({rule[2]})" for m, targets in graph.items() for t in targets
                  for rule in LAYERING if breaks(rule, m, t))


def test_no_import_loops() -> None:
    found = cycles(import_graph())
    assert not found, "import loops: " + "; ".join(" -> ".join(c) for c in found)


def test_the_former_loops_stay_cut() -> None:
    g = import_graph()
    assert "specdiag.telemetry.sampler" not in g["specdiag.telemetry.nvml"]
    assert "specdiag.telemetry.sampler" not in g["specdiag.telemetry.prometheus"]
    # the plugin's log lines live in their own module, below both hook modules
    assert "specdiag_sglang_plugin.hook" not in g["specdiag_sglang_plugin.contiguous"]
    assert {"specdiag_sglang_plugin.logs"} <= g["specdiag_sglang_plugin.contiguous"] & g["specdiag_sglang_plugin.hook"]


def test_the_graph_reads_the_plugin() -> None:
    g = import_graph()
    assert "specdiag.kernels.verify" in g["specdiag_sglang_plugin.hook"]
    assert cycles({**g, "specdiag_sglang_plugin.logs": {"specdiag_sglang_plugin.hook"}})


def test_the_library_keeps_its_layering() -> None:
    found = layering_breaks(import_graph())
    assert not found, "imports against the layering (tests/test_import_graph.py LAYERING):\n" + "\n".join(found)


def test_the_layering_check_sees_each_kind_of_break() -> None:
    """Arrows the library once had are caught, one per rule; what the rules allow is not."""
    graph = {
        "specdiag.steps.findings.overview": {"specdiag.steps.baseline_sweep.sweep", "specdiag.steps.findings.page"},
        "specdiag.steps.kv_layout.analysis": {"specdiag.steps.kernel_ab", "specdiag.roofline"},
        "specdiag.hardware": {"specdiag.steps.bandwidth_analysis.roofline", "specdiag.stats"},
        "specdiag.localserver.lifecycle": {"specdiag.launchers.process", "specdiag.process"},
        "specdiag.report.execute": {"specdiag.steps.findings.page", "specdiag.launchers"},
        "specdiag.steps.findings.page": {"specdiag.report.render"},
        "specdiag.nb": {"specdiag.report.execute"},
        "specdiag.sweep.registry": {"specdiag.steps.engine_ab.measure"},
        "specdiag.launchers": {"specdiag.localserver"},
        "specdiag.kvalloc": {"specdiag_sglang_plugin.contiguous"},
        "specdiag_sglang_plugin.contiguous": {"specdiag.kvalloc"},
    }
    assert [b.split(" (")[0] for b in layering_breaks(graph)] == [
        "specdiag.hardware -> specdiag.steps.bandwidth_analysis.roofline",
        "specdiag.kvalloc -> specdiag_sglang_plugin.contiguous",
        "specdiag.localserver.lifecycle -> specdiag.launchers.process",
        "specdiag.nb -> specdiag.report.execute",
        "specdiag.report.execute -> specdiag.steps.findings.page",
        "specdiag.steps.findings.overview -> specdiag.steps.baseline_sweep.sweep",
        "specdiag.steps.findings.page -> specdiag.report.render",
        "specdiag.steps.kv_layout.analysis -> specdiag.steps.kernel_ab",
        "specdiag.sweep.registry -> specdiag.steps.engine_ab.measure",
    ]


def test_imports_inside_functions_relative_and_by_name_count() -> None:
    src = ("import os\n"
           "from . import arms\n"
           "from ..bandwidth_analysis.roofline import BELOW_FLOOR_X\n"
           "def f():\n"
           "    from specdiag.steps.kernel_ab import analysis as kab\n"
           "    return importlib.import_module('specdiag.steps.engine_ab.measure')\n")
    names = imported_names(ast.parse(src), "specdiag.steps.findings.diagnosis")
    assert {"specdiag.steps.findings.arms", "specdiag.steps.bandwidth_analysis.roofline",
            "specdiag.steps.kernel_ab.analysis", "specdiag.steps.engine_ab.measure"} <= names
    assert "specdiag.steps.findings" in imported_names(ast.parse("from . import x\n"), "specdiag.steps.findings", True)
