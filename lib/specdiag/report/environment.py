"""Jupyter, IPython and matplotlib state of a report run stays in the project (``.jupyter-local``), never in HOME."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from specdiag.paths import PROJECT_ROOT

LOCAL_STATE_DIR = PROJECT_ROOT / ".jupyter-local"


def local_jupyter_env(base: Path = LOCAL_STATE_DIR) -> dict[str, str]:
    """IPYTHONDIR, JUPYTER_* and MPLCONFIGDIR under ``base`` (created), unless already set."""
    wanted = {
        "IPYTHONDIR": base / "ipython",
        "JUPYTER_CONFIG_DIR": base / "config",
        "JUPYTER_DATA_DIR": base / "data",
        "JUPYTER_RUNTIME_DIR": base / "runtime",
        "MPLCONFIGDIR": base / "matplotlib",
    }
    env = {}
    for key, path in wanted.items():
        value = os.environ.get(key) or str(path)
        Path(value).mkdir(parents=True, exist_ok=True)
        env[key] = value
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    share = target_share_dir()
    if share is not None:
        paths = [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
        env["JUPYTER_PATH"] = os.pathsep.join(paths + [str(share)] if str(share) not in paths else paths)
    return env


def target_share_dir() -> Path | None:
    """``<folder>/share/jupyter`` beside nbconvert when the Jupyter stack was installed with ``pip install --target
    <folder>`` (a GPU host's site folder on PYTHONPATH): nbconvert's templates land there, outside every path Jupyter
    searches, and rendering fails with "No template sub-directory with name 'lab'". None where nbconvert is not found
    or sits in an environment's own site-packages (its prefix's share/ is searched already)."""
    spec = importlib.util.find_spec("nbconvert")
    if spec is None or not spec.origin:
        return None
    share = Path(spec.origin).resolve().parents[1] / "share" / "jupyter"
    return share if (share / "nbconvert" / "templates").is_dir() else None


def apply_local_jupyter_env() -> None:
    os.environ.update(local_jupyter_env())
    # No MPLBACKEND here: kernels must keep their inline backend, or figures never reach the notebook.
