"""Every name the SGLang plugin hooks exists in SGLang 0.5.17, as recorded from its source.

SGLang's hook registry logs and skips a target that does not resolve, so a wrong method name leaves a switch of the
plugin silently off on a real server. tests/data/sglang-0.5.17/hook-targets.json was written by
scripts/record_sglang_hook_targets.py from a real SGLang 0.5.17 install (the class whose body defines each target).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "data" / "sglang-0.5.17" / "hook-targets.json"


def _recorder():
    spec = importlib.util.spec_from_file_location("record_sglang_hook_targets",
                                                  ROOT / "scripts" / "record_sglang_hook_targets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_hooked_name_is_defined_in_sglang_0_5_17() -> None:
    recorded = json.loads(RECORDED.read_text())
    assert recorded["sglang"] == "0.5.17"
    defined = recorded["defined_in"]
    targets = _recorder().plugin_targets()
    unrecorded = [t for t in targets if t not in defined]
    assert not unrecorded, (f"not in {RECORDED.name}: {unrecorded}; re-record with scripts/record_sglang_hook_targets.py "
                            "--site <an SGLang 0.5.17 site-packages>")
    missing = [t for t in targets if not defined[t]]
    assert not missing, f"SGLang 0.5.17 defines none of: {missing}"


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
