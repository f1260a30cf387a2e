"""Jupyter, IPython and matplotlib state of a report run stays in the project (``.jupyter-local``), never in HOME."""

from __future__ import annotations

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
    return env


def apply_local_jupyter_env() -> None:
    os.environ.update(local_jupyter_env())
    # No MPLBACKEND here: kernels must keep their inline backend, or figures never reach the notebook.
