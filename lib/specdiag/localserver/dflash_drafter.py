"""The DFlash drafter the embedded engine (and the vLLM launcher) use when none is given.

- The shipped target with a trained drafter in ``data/models/dflash/``: that one.
- Otherwise a **random-weight** tiny drafter (``data/models/make_dflash_drafter.py --shape tiny``, seed 0), made on
  first use into ``.dflash-models/`` (git-ignored), one folder per target config. Its drafts are noise: a target
  commits about one token per verify step on them. It serves, times and checks the DFLASH path; it says nothing
  about a trained drafter's commit lengths.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from types import ModuleType

from specdiag.paths import MODELS_DIR, PROJECT_ROOT

TRAINED_DIR = MODELS_DIR / "dflash"
CACHE_DIR = PROJECT_ROOT / ".dflash-models"
MAKER = MODELS_DIR / "make_dflash_drafter.py"


def _maker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_dflash_drafter", MAKER)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"cannot load {MAKER}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_drafter_dir(target: Path, cache_dir: Path = CACHE_DIR) -> Path:
    """Where the random tiny drafter for ``target`` lives: named by a hash of the target's config.json."""
    digest = hashlib.sha256((Path(target) / "config.json").read_bytes()).hexdigest()[:12]
    return Path(cache_dir) / f"random-tiny-{Path(target).name}-{digest}"


def default_dflash_drafter(target: Path = MODELS_DIR / "target", cache_dir: Path = CACHE_DIR) -> Path:
    """The trained drafter for the shipped target when shipped, else the random tiny one (made now if missing;
    written to a temporary folder and renamed, so concurrent callers never see half a folder)."""
    target = Path(target)
    if not (target / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in the target folder {target}: give the target model's folder")
    if target.resolve() == (MODELS_DIR / "target").resolve() and (TRAINED_DIR / "config.json").is_file():
        return TRAINED_DIR
    out = random_drafter_dir(target, cache_dir)
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        _maker().build(target, tmp, shape="tiny", seed=0)
        try:
            os.rename(tmp, out)
        except OSError:  # another process made it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


__all__ = ["CACHE_DIR", "TRAINED_DIR", "default_dflash_drafter", "random_drafter_dir"]
