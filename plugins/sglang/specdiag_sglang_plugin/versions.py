"""Which SGLang the plugin serves: a switch goes in only where SGLang's code under its hooks is the tested code.

The plugin was run on SGLang 0.5.17 (the GPU image; newer releases pin a newer torch). Its hooks replace or wrap
SGLang methods whose code they assume (hook.py stores the draft block's KV as 0.5.17's ``forward_extend`` does,
contiguous.py keeps 0.5.17's free-group flag, ngram_tail.py copies 0.5.17's NGRAM methods). So at registration
:func:`guard` reads, with ``ast`` and without importing SGLang, the source of every method the plugin hooks in the
SGLang installed beside it, and compares it with 0.5.17's (``sglang-0.5.17-hook-targets.json`` beside this module, one
SHA-256 per method; written by scripts/record_sglang_hook_targets.py from 0.5.17's wheel). A switch (:func:`switches`)
any of whose methods differs is left to SGLang: its environment variable is set to off for the registration (as if the
user had: every other log line of the plugin then agrees), and SGLang's hook registry is not handed any differing
target. A verify mode left to SGLang takes the NGRAM tail and the prefill path with it, as
``SPECDIAG_SGLANG_VERIFY=off`` does. One log line, before the others, says which SGLang runs and, on code other than
the tested one's, what is left to SGLang. ``SPECDIAG_SGLANG_ANY_VERSION=1`` registers every switch as asked, on the
user's word. Where SGLang's version or source cannot be read, the hooks go in unchecked and the line says so.

A method's code is its lines from its first decorator to its end, blank and comment-only lines left out (a method
defined on a base class is found through the module's imports, as Python would look it up).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.util
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

ANY_VERSION_ENV = "SPECDIAG_SGLANG_ANY_VERSION"
RECORDS = Path(__file__).resolve().parent
TESTED = ("0.5.17",)  # the SGLang versions the plugin ran on (a GPU image each); the reference code is the first's
_logger = logging.getLogger("specdiag_sglang_plugin")
_said: set = set()


@dataclass(frozen=True)
class Switch:
    """One thing the plugin does to SGLang, as the environment turns it on and off."""

    name: str  # as the log line says it
    targets: tuple[str, ...]  # the SGLang methods its hooks need
    env: str | None  # the variable that turns it off (None: kept out at the hook registry only)
    off: str  # that variable's value for off
    asked: Callable[[Mapping[str, str]], bool]  # whether an environment asks for it


def _asks(parse: Callable[[Mapping[str, str]], object], environ: Mapping[str, str]) -> object:
    try:
        return parse(environ)
    except ValueError:  # a bad value: the module that reads it says so and keeps SGLang's path
        return None


def switches() -> list[Switch]:
    """Every switch of the plugin, with the SGLang methods it hooks (a method may serve several)."""
    from specdiag_sglang_plugin import backends, contiguous, hook, layout, ngram_tail, prefill  # noqa: PLC0415

    def mode(e: Mapping[str, str]) -> str | None:
        return _asks(hook.mode_from_env, e) if hook.activation_from_env(e)[0] else None

    return [
        Switch("the split-KV verify", (hook.FORWARD_EXTEND,), hook.MODE_ENV, "off", lambda e: mode(e) == "splitkv"),
        Switch("the upstream split-KV switch", (hook.BACKEND_INIT,), hook.MODE_ENV, "off",
               lambda e: mode(e) == "upstream"),
        Switch("the NGRAM prompt tail", (ngram_tail.PREPARE, ngram_tail.UPDATE), hook.NGRAM_TAIL_ENV, "0",
               lambda e: mode(e) in ("splitkv", "upstream") and bool(_asks(hook.ngram_tail_from_env, e))),
        Switch("the MHA prefill", (prefill.DISPATCH, hook.FORWARD_EXTEND), prefill.PREFILL_ENV, "off",
               lambda e: mode(e) in ("splitkv", "upstream") and _asks(prefill.prefill_from_env, e) == "mha"),
        Switch("the contiguous KV allocator", (contiguous.ALLOC_MEMORY_POOL,
                                               *(f"{contiguous.TOKEN_ALLOCATOR}.{m}" for m in contiguous.METHODS)),
               contiguous.ALLOC_ENV, "sglang", lambda e: _asks(contiguous.alloc_mode_from_env, e) == "contiguous"),
        Switch("the KV layout recorder", (layout.MODEL_RUNNER_FORWARD,), layout.LAYOUT_ENV, "0",
               lambda e: bool(_asks(layout.layout_from_env, e))),
        Switch("the attention-paths log line", (backends.INIT_BACKENDS,), None, "",
               lambda e: mode(e) in ("splitkv", "upstream")),
    ]


def all_targets() -> list[str]:
    """Every dotted SGLang name the plugin can register a hook on, whatever its environment switches."""
    return sorted({t for sw in switches() for t in sw.targets})


def reference_record(version: str = TESTED[0]) -> dict:
    """The recorded hook targets of one tested SGLang: ``{"sglang", "defined_in", "source_sha256"}``."""
    return json.loads((RECORDS / f"sglang-{version}-hook-targets.json").read_text())


# ---- reading an SGLang install's source (no import) ----

def module_file(site: Path, module: str) -> Path | None:
    base = site.joinpath(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _definition(site: Path, module: str, cls: str, attr: str, depth: int = 0) -> tuple[str, str] | None:
    """(``module.Class`` whose body defines ``attr`` for ``module.cls``, the SHA-256 of that definition's code)."""
    path = module_file(site, module)
    if path is None or depth > 8:
        return None
    text = path.read_text()
    tree = ast.parse(text)
    imports = {a.asname or a.name: f"{n.module}.{a.name}" for n in tree.body if isinstance(n, ast.ImportFrom)
               and n.module and n.level == 0 for a in n.names}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for b in node.body:
                named = (b.name == attr if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) else
                         isinstance(b, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr
                                                           for t in b.targets))
                if named:
                    return f"{module}.{cls}", code_sha256(text, b)
            for base in node.bases:
                name = base.id if isinstance(base, ast.Name) else None
                if name and name in imports:
                    mod, _, bcls = imports[name].rpartition(".")
                    found = _definition(site, mod, bcls, attr, depth + 1)
                elif name:
                    found = _definition(site, module, name, attr, depth + 1)
                else:
                    found = None
                if found:
                    return found
            return None
    if cls in imports:  # re-exported from another module
        mod, _, real = imports[cls].rpartition(".")
        return _definition(site, mod, real, attr, depth + 1)
    return None


def code_sha256(text: str, node: ast.stmt) -> str:
    """SHA-256 of ``node``'s lines in ``text`` (decorators included), blank and comment-only lines left out."""
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    lines = text.splitlines()[first - 1:node.end_lineno]
    kept = [ln.rstrip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()


def definition(site: Path, target: str) -> tuple[str, str] | None:
    """Where ``target`` (``module.Class.attr``) is defined in the install at ``site``, and its code's SHA-256."""
    parts = target.split(".")
    if len(parts) < 3:
        return None
    module = ".".join(parts[:-2])
    if module_file(site, module) is None:
        return None
    return _definition(site, module, parts[-2], parts[-1])


def record(site: Path, targets: list[str]) -> dict:
    """The record :func:`guard` compares against: the install's version, each target's class and code SHA-256."""
    dist = sorted(site.glob("sglang-*.dist-info"))
    found = {t: definition(site, t) for t in targets}
    return {"sglang": dist[0].name[len("sglang-"):-len(".dist-info")] if dist else None,
            "defined_in": {t: f[0] if f else None for t, f in found.items()},
            "source_sha256": {t: f[1] if f else None for t, f in found.items()}}


# ---- the check ----

@dataclass(frozen=True)
class VersionCheck:
    """What the plugin hooks on one SGLang install."""

    version: str | None  # the installed SGLang's version (None: not readable)
    unread: str  # why the installed SGLang's source could not be read ("" when it was)
    differing: tuple[str, ...]  # hook targets whose code differs from the reference's (or is absent)
    reference: str = TESTED[0]

    @property
    def tested(self) -> bool:
        return not self.unread and self.version in TESTED and not self.differing

    def left(self, sws: list[Switch]) -> list[Switch]:
        """The switches whose hooks need a method whose code differs."""
        return [sw for sw in sws if any(t in self.differing for t in sw.targets)]


def compare(installed: dict, reference: dict) -> VersionCheck:
    """Pure: an install's record (:func:`record`) against a tested one's; a target absent from either differs."""
    ref, got = reference["source_sha256"], installed["source_sha256"]
    differing = tuple(sorted(t for t in set(ref) | set(got) if not ref.get(t) or ref.get(t) != got.get(t)))
    return VersionCheck(installed.get("sglang"), "", differing, reference["sglang"])


def installed_check(targets: list[str]) -> VersionCheck:
    """The check of the SGLang this process imports (read from its files, not imported beyond ``sglang``)."""
    try:
        spec = importlib.util.find_spec("sglang")
        site = Path(spec.submodule_search_locations[0]).parent
        version = str(importlib.import_module("sglang.version").__version__)
    except Exception as exc:  # noqa: BLE001  (a stand-in module, a zipped install, no version file)
        return VersionCheck(None, f"{type(exc).__name__}: {exc}", ())
    try:
        reference = reference_record()
    except (OSError, ValueError) as exc:  # installed without its package data
        return VersionCheck(version, f"no record of SGLang {TESTED[0]}'s code ({type(exc).__name__}: {exc})", ())
    found = record(site, targets)
    found["sglang"] = version
    return compare(found, reference)


def _short(target: str) -> str:
    return ".".join(target.split(".")[-2:])


def summary(check: VersionCheck, asked: list[Switch], anyway: bool) -> str:
    """The one line at registration: the SGLang served and, on code other than the tested one's, which of the
    ``asked`` switches are left to it."""
    if check.unread:
        return f"SGLang's version or source not readable ({check.unread}): hooks registered unchecked"
    if check.tested:
        return f"serves SGLang {check.version} (tested)"
    head = f"serves SGLang {check.version} (tested: {', '.join(TESTED)})"
    left = check.left(asked)
    if not left:
        return f"{head}: every method hooked for what is asked is {check.reference}'s code"
    said = "; ".join(f"{sw.name} ({', '.join(_short(t) for t in sw.targets if t in check.differing)})"
                     for sw in left)
    if anyway:
        return f"{head}; {ANY_VERSION_ENV}=1: hooked although their code differs from {check.reference}'s: {said}"
    kept = [sw.name for sw in asked if sw not in left]
    return (f"{head}; left to SGLang, their code differs from {check.reference}'s: {said}"
            + (f"; kept: {', '.join(kept)}" if kept else "") + f" ({ANY_VERSION_ENV}=1 hooks them anyway)")


def guard(register: Callable[[], None]) -> Callable[[], None]:
    """``register`` run with what it may hook checked first: a switch whose code differs from the tested SGLang's is
    turned off for the registration and its targets kept from SGLang's ``HookRegistry.register``; the outcome is
    logged in one line (once per process) before register's own lines."""

    @functools.wraps(register)
    def checked() -> None:
        try:
            from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: PLC0415
        except ImportError:
            return register()  # register() says that nothing can be registered
        sws = switches()
        check = installed_check(sorted({t for sw in sws for t in sw.targets}))
        anyway = os.environ.get(ANY_VERSION_ENV, "").strip() == "1"
        asked = [sw for sw in sws if sw.asked(os.environ)]
        if asked:
            _say(summary(check, asked, anyway))
        if anyway or check.unread or not check.differing:
            return register()
        overrides = {sw.env: sw.off for sw in check.left(asked) if sw.env}
        saved = {k: os.environ.get(k) for k in overrides}
        original, bound = HookRegistry.__dict__["register"], HookRegistry.register

        def filtered(target, hook, *args, **kwargs):
            return None if target in check.differing else bound(target, hook, *args, **kwargs)

        os.environ.update(overrides)
        HookRegistry.register = staticmethod(filtered)  # plugins register one at a time (SGLang's load_plugins)
        try:
            register()
        finally:
            HookRegistry.register = original
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    return checked


def _say(line: str) -> None:
    if line not in _said:
        _said.add(line)
        _logger.warning("[specdiag plugin] %s", line)
