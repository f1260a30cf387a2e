"""Project paths, derived from the repository root in one place."""

from __future__ import annotations

import os
from pathlib import Path

#: Root of the repository (the folder holding pyproject.toml). SPECDIAG_ROOT overrides it,
#: for an installed copy that should read another checkout's data.
PROJECT_ROOT: Path = Path(os.environ.get("SPECDIAG_ROOT", Path(__file__).resolve().parents[2]))
NOTEBOOKS_DIR: Path = PROJECT_ROOT / "notebooks"
DATA_DIR: Path = PROJECT_ROOT / "data"
RUNS_DIR: Path = DATA_DIR / "runs"
REFERENCE_DIR: Path = DATA_DIR / "reference"
MODELS_DIR: Path = DATA_DIR / "models"
PARAMS_DIR: Path = PROJECT_ROOT / "params"
