"""Record where each target the SGLang plugin hooks is defined in a real SGLang install (read, not imported).

The plugin patches SGLang by dotted names (``module.Class.method``) through SGLang's hook registry, which logs and
skips a name that does not resolve: a renamed method leaves the plugin silently off. This reads the install's source
with ``ast`` (no GPU, no import of SGLang) and writes, for every target of :func:`plugin_targets`, the class whose
body defines it (the class itself or a base class found through the module's imports), or null::

    python scripts/record_sglang_hook_targets.py --site /path/to/site-packages \\
        --out tests/data/sglang-0.5.17/hook-targets.json

tests/test_sglang_plugin_targets.py fails when the plugin names a target the recorded install does not define.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def plugin_targets() -> list[str]:
    """Every dotted SGLang name the plugin can register a hook on, whatever its environment switches."""
    sys.path[:0] = [str(ROOT / "plugins" / "sglang"), str(ROOT / "lib")]
    from specdiag_sglang_plugin import backends, contiguous, hook, layout, ngram_tail, prefill  # noqa: PLC0415

    return sorted({hook.FORWARD_EXTEND, hook.BACKEND_INIT, layout.MODEL_RUNNER_FORWARD, ngram_tail.PREPARE,
                   prefill.DISPATCH, backends.INIT_BACKENDS,
                   ngram_tail.UPDATE, contiguous.ALLOC_MEMORY_POOL,
                   *(f"{contiguous.TOKEN_ALLOCATOR}.{m}" for m in contiguous.METHODS)})


def _module_file(site: Path, module: str) -> Path | None:
    base = site.joinpath(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def defining_class(site: Path, module: str, cls: str, attr: str, depth: int = 0) -> str | None:
    """``module.Class`` whose body defines ``attr`` for ``module.cls`` (its bases followed through imports)."""
    path = _module_file(site, module)
    if path is None or depth > 8:
        return None
    tree = ast.parse(path.read_text())
    imports = {a.asname or a.name: f"{n.module}.{a.name}" for n in tree.body if isinstance(n, ast.ImportFrom)
               and n.module and n.level == 0 for a in n.names}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            names = {b.name for b in node.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))}
            names |= {t.id for b in node.body if isinstance(b, ast.Assign) for t in b.targets if isinstance(t, ast.Name)}
            if attr in names:
                return f"{module}.{cls}"
            for base in node.bases:
                name = base.id if isinstance(base, ast.Name) else None
                if name and name in imports:
                    mod, _, bcls = imports[name].rpartition(".")
                    found = defining_class(site, mod, bcls, attr, depth + 1)
                    if found:
                        return found
                elif name:
                    found = defining_class(site, module, name, attr, depth + 1)
                    if found:
                        return found
            return None
    if cls in imports:  # re-exported from another module
        mod, _, real = imports[cls].rpartition(".")
        return defining_class(site, mod, real, attr, depth + 1)
    return None


def resolve(site: Path, target: str) -> str | None:
    parts = target.split(".")
    for i in range(len(parts) - 2, 0, -1):  # the longest module prefix that exists, then Class.attr
        module = ".".join(parts[:i])
        if _module_file(site, module) is not None and len(parts) - i == 2:
            return defining_class(site, module, parts[i], parts[i + 1])
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", type=Path, required=True, help="the site-packages folder that holds sglang/")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    dist = sorted(args.site.glob("sglang-*.dist-info"))
    if not (args.site / "sglang").is_dir() or not dist:
        ap.error(f"{args.site} holds no sglang package with its dist-info: point --site at the folder that holds it")
    version = dist[0].name[len("sglang-"):-len(".dist-info")]
    found = {t: resolve(args.site, t) for t in plugin_targets()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"sglang": version, "defined_in": found}, indent=1) + "\n")
    for t, where in found.items():
        print(f"{'ok     ' if where else 'MISSING'} {t}" + (f"  ({where})" if where else ""))
    return 0 if all(found.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
