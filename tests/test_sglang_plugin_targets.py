"""The SGLang the plugin hooks: every name it hooks exists in the recorded SGLangs, and on any other code than the
tested one's it leaves that switch to SGLang and says so in one line.

SGLang's hook registry logs and skips a target that does not resolve, so a wrong method name leaves a switch of the
plugin silently off on a real server. The records were written by scripts/record_sglang_hook_targets.py from the
wheels' source (``pip download --no-deps sglang==X``): 0.5.17, the tested version, ships with the plugin
(plugins/sglang/specdiag_sglang_plugin/sglang-0.5.17-hook-targets.json); 0.5.23, the newest a user may run, in
tests/data/sglang-0.5.23/.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import os
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins" / "sglang"), str(ROOT / "lib")]

from specdiag_sglang_plugin import contiguous, hook, versions  # noqa: E402

RECORDED = {"0.5.17": ROOT / "plugins" / "sglang" / "specdiag_sglang_plugin" / "sglang-0.5.17-hook-targets.json",
            "0.5.23": ROOT / "tests" / "data" / "sglang-0.5.23" / "hook-targets.json"}


@pytest.fixture(autouse=True)
def _hook_state_kept():
    """register() records its mode in hook.STATS, which the hook reads on every call: put it back for other tests."""
    saved = copy.deepcopy(hook.STATS)
    yield
    hook.STATS.clear()
    hook.STATS.update(saved)


def _recorder():
    spec = importlib.util.spec_from_file_location("record_sglang_hook_targets",
                                                  ROOT / "scripts" / "record_sglang_hook_targets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("version", sorted(RECORDED))
def test_every_hooked_name_is_defined_in_each_recorded_sglang(version: str) -> None:
    recorded = json.loads(RECORDED[version].read_text())
    assert recorded["sglang"] == version
    defined, digests = recorded["defined_in"], recorded["source_sha256"]
    targets = _recorder().plugin_targets()
    unrecorded = [t for t in targets if t not in defined or t not in digests]
    assert not unrecorded, (f"not in {RECORDED[version]}: {unrecorded}; re-record with "
                            f"scripts/record_sglang_hook_targets.py --site <SGLang {version}'s unzipped wheel>")
    missing = [t for t in targets if not defined[t] or not digests[t]]
    assert not missing, f"SGLang {version} defines none of: {missing}"


def test_the_shipped_record_is_the_tested_version() -> None:
    assert versions.reference_record()["sglang"] == versions.TESTED[0]
    assert RECORDED[versions.TESTED[0]] == versions.RECORDS / f"sglang-{versions.TESTED[0]}-hook-targets.json"


class _Registry:
    """SGLang's HookRegistry as far as the plugin uses it (a classmethod ``register``)."""

    calls: list = []

    @classmethod
    def register(cls, target, fn, kind=None):
        cls.calls.append(target)


def _fake_registry(monkeypatch) -> None:
    _Registry.calls = []
    mod = types.ModuleType("sglang.srt.plugins.hook_registry")
    mod.HookRegistry = _Registry
    mod.HookType = type("HookType", (), {"AROUND": "around", "AFTER": "after", "BEFORE": "before"})
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.plugins.hook_registry", mod)


def _every_switch_on(monkeypatch, mode: str = "splitkv") -> None:
    monkeypatch.setenv(hook.MODE_ENV, mode)
    monkeypatch.setenv(hook.NGRAM_TAIL_ENV, "1")
    monkeypatch.setenv("SPECDIAG_SGLANG_KV_ALLOC", "contiguous")
    monkeypatch.setenv("SPECDIAG_SGLANG_LAYOUT", "1")
    monkeypatch.setenv("SPECDIAG_SGLANG_PREFILL", "mha")


def _switch(name: str) -> versions.Switch:
    return next(sw for sw in versions.switches() if sw.name == name)


@pytest.mark.parametrize("mode", ["splitkv", "upstream"])
def test_every_target_the_plugin_registers_is_a_recorded_switch(monkeypatch, mode: str) -> None:
    """A hook added without a place in versions.switches() would escape the version check and the records."""
    _fake_registry(monkeypatch)
    _every_switch_on(monkeypatch, mode)
    hook.register()
    known = set(_recorder().plugin_targets())
    assert _Registry.calls and set(_Registry.calls) <= known, set(_Registry.calls) - known
    asked = {sw.name for sw in versions.switches() if sw.asked(os.environ)}
    assert "the contiguous KV allocator" in asked and "the NGRAM prompt tail" in asked
    assert ("the split-KV verify" in asked) == (mode == "splitkv")


def test_on_sglang_0_5_23_every_switch_differs_from_0_5_17_and_is_named() -> None:
    rec17, rec23 = (json.loads(RECORDED[v].read_text()) for v in ("0.5.17", "0.5.23"))
    check = versions.compare(rec23, rec17)
    assert check.version == "0.5.23" and not check.tested
    sws = versions.switches()
    # recorded from the wheels: each switch has at least one hooked method whose code changed in 0.5.23
    assert check.left(sws) == sws
    same = set(rec17["source_sha256"]) - set(check.differing)  # unchanged, yet the allocator is left whole
    assert same == {f"{contiguous.TOKEN_ALLOCATOR}.{m}" for m in ("alloc", "available_size", "merge_and_sort_free")}
    asked = [_switch("the split-KV verify"), _switch("the NGRAM prompt tail")]
    line = versions.summary(check, asked, anyway=False)
    assert line.startswith("serves SGLang 0.5.23 (tested: 0.5.17); left to SGLang")
    assert "the split-KV verify (TritonAttnBackend.forward_extend)" in line and "kept" not in line
    assert versions.ANY_VERSION_ENV in line and "contiguous" not in line  # only what was asked for is named
    assert versions.compare(rec17, rec17).tested
    assert versions.summary(versions.compare(rec17, rec17), asked, anyway=False) == "serves SGLang 0.5.17 (tested)"


def _site(tmp_path: Path, version: str, forward_extend_body: str) -> Path:
    """A stand-in SGLang install: its version file and the Triton backend's forward_extend."""
    pkg = tmp_path / "sglang"
    (pkg / "srt" / "layers" / "attention").mkdir(parents=True)
    for d in (pkg, pkg / "srt", pkg / "srt" / "layers", pkg / "srt" / "layers" / "attention"):
        (d / "__init__.py").write_text("")
    (pkg / "version.py").write_text(f"__version__ = {version!r}\n")
    (pkg / "srt" / "layers" / "attention" / "triton_backend.py").write_text(
        "class TritonAttnBackend:\n    def forward_extend(self, q):\n" + forward_extend_body)
    return tmp_path


def test_installed_check_reads_the_version_and_the_code_of_the_sglang_on_the_path(monkeypatch, tmp_path) -> None:
    site = _site(tmp_path, "9.9.9", "        return q\n")
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(site))
    check = versions.installed_check([hook.FORWARD_EXTEND])
    assert check.version == "9.9.9" and not check.unread and hook.FORWARD_EXTEND in check.differing


def test_code_digest_ignores_comments_and_blank_lines_not_code(tmp_path) -> None:
    a = versions.definition(_site(tmp_path / "a", "1", "        return q\n"), hook.FORWARD_EXTEND)
    b = versions.definition(_site(tmp_path / "b", "1", "\n        # why\n        return q  \n"), hook.FORWARD_EXTEND)
    c = versions.definition(_site(tmp_path / "c", "1", "        return -q\n"), hook.FORWARD_EXTEND)
    assert a[0] == "sglang.srt.layers.attention.triton_backend.TritonAttnBackend"
    assert a[1] == b[1] != c[1]


def _as_installed(monkeypatch, version: str, changed: tuple[str, ...]) -> None:
    """The installed SGLang reads as 0.5.17's code but for ``changed`` targets."""
    rec17 = versions.reference_record()
    digests = dict(rec17["source_sha256"], **{t: "another" for t in changed})
    check = versions.compare({"sglang": version, "source_sha256": digests}, rec17)
    monkeypatch.setattr(versions, "installed_check", lambda targets: check)
    monkeypatch.setattr(versions, "_said", set())


def test_guard_leaves_differing_switches_to_sglang_and_says_so_once(monkeypatch, caplog) -> None:
    _fake_registry(monkeypatch)
    _every_switch_on(monkeypatch)
    ngram = _switch("the NGRAM prompt tail")
    _as_installed(monkeypatch, "0.6.0", (ngram.targets[0],))
    original = _Registry.__dict__["register"]
    with caplog.at_level(logging.WARNING, logger="specdiag_sglang_plugin"):
        versions.guard(hook.register)()
        versions.guard(hook.register)()
    assert _Registry.__dict__["register"] is original  # SGLang's registry as it was
    assert os.environ[hook.NGRAM_TAIL_ENV] == "1"  # the user's environment as it was
    registered = set(_Registry.calls)
    assert not registered & set(ngram.targets)
    assert set(_switch("the contiguous KV allocator").targets) <= registered  # unchanged: hooked as tested
    messages = [r.getMessage() for r in caplog.records]
    lines = [m for m in messages if "SGLang 0.6.0" in m]
    assert len(lines) == 1 and "left to SGLang" in lines[0] and "the NGRAM prompt tail" in lines[0]
    assert "kept: the split-KV verify" in lines[0]
    assert not any("NGRAM drafting reads only the prompt's tail" in m for m in messages)  # no line says otherwise

    _Registry.calls = []
    monkeypatch.setenv(versions.ANY_VERSION_ENV, "1")
    versions.guard(hook.register)()
    assert set(ngram.targets) <= set(_Registry.calls)


def test_a_verify_mode_left_to_sglang_is_off_with_what_rides_on_it(monkeypatch, caplog) -> None:
    _fake_registry(monkeypatch)
    _every_switch_on(monkeypatch)
    _as_installed(monkeypatch, "0.6.0", (hook.FORWARD_EXTEND,))
    with caplog.at_level(logging.WARNING, logger="specdiag_sglang_plugin"):
        versions.guard(hook.register)()
    registered = set(_Registry.calls)
    assert hook.FORWARD_EXTEND not in registered and not registered & set(_switch("the NGRAM prompt tail").targets)
    assert set(_switch("the KV layout recorder").targets) <= registered
    line = next(r.getMessage() for r in caplog.records if "SGLang 0.6.0" in r.getMessage())
    assert "the split-KV verify (TritonAttnBackend.forward_extend); the MHA prefill (TritonAttnBackend" in line


def test_guard_hooks_unchecked_where_sglangs_source_cannot_be_read(monkeypatch, caplog) -> None:
    _fake_registry(monkeypatch)  # stand-in modules: no version file, no source
    _every_switch_on(monkeypatch)
    monkeypatch.setattr(versions, "_said", set())
    with caplog.at_level(logging.WARNING, logger="specdiag_sglang_plugin"):
        versions.guard(hook.register)()
    assert set(_switch("the contiguous KV allocator").targets) <= set(_Registry.calls)
    assert any("not readable" in r.getMessage() and "unchecked" in r.getMessage() for r in caplog.records)


def test_the_entry_point_is_the_guarded_register() -> None:
    import specdiag_sglang_plugin

    assert specdiag_sglang_plugin.register.__wrapped__ is hook.register


def test_the_recorder_finds_inherited_methods_and_misses_absent_ones(tmp_path: Path) -> None:
    """Against a two-module fake install: a base class's method through an import resolves, a missing one is None."""
    pkg = tmp_path / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (pkg / "base.py").write_text("class Base:\n    def free_group_begin(self):\n        pass\n")
    (pkg / "token.py").write_text("from sglang.srt.base import Base\n\nclass Alloc(Base):\n    def alloc(self, n):\n"
                                  "        pass\n")
    rec = _recorder()
    assert rec.resolve(tmp_path, "sglang.srt.token.Alloc.alloc") == "sglang.srt.token.Alloc"
    assert rec.resolve(tmp_path, "sglang.srt.token.Alloc.free_group_begin") == "sglang.srt.base.Base"
    assert rec.resolve(tmp_path, "sglang.srt.token.Alloc.backup_state") is None
    assert rec.resolve(tmp_path, "sglang.srt.nowhere.Alloc.alloc") is None
