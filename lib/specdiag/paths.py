"""Project paths, derived from the repository root in one place, and how a page shows a path.

Reports are shared: a path on a page is shown relative to the project root (``data/runs/<id>``), never as
the absolute path of the machine that made it (:func:`shown`; :class:`ShownPath` does it for f-strings).
"""

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


def relative_to_project(path: str | os.PathLike[str]) -> str:
    """``path`` relative to the project root when it lies inside it (POSIX form), else absolute. What a
    notebook parameter or run.json records: :meth:`specdiag.runs.Run.open` resolves it against the root."""
    absolute = Path(os.path.abspath(Path(path).expanduser()))  # links kept: .venv/bin/python stays in the project
    for candidate, root in ((absolute, PROJECT_ROOT), (absolute.resolve(), PROJECT_ROOT.resolve())):
        try:
            return candidate.relative_to(root).as_posix() or "."
        except ValueError:
            continue
    return str(absolute)


def shown(path: str | os.PathLike[str]) -> str:
    """``path`` as a page shows it: relative to the project root when inside it, ``~/...`` under the home
    folder, else as is."""
    rel = relative_to_project(path)
    if Path(rel).is_absolute():
        try:
            return "~/" + Path(rel).relative_to(Path.home().resolve()).as_posix()
        except (ValueError, RuntimeError):
            return rel
    return rel


class ShownPath(type(Path())):  # type: ignore[misc]  # the concrete PosixPath/WindowsPath
    """A Path whose f-string form is :func:`shown` (``f"{run.path}"`` -> ``data/runs/<id>``), so notebooks
    print shareable paths; ``str()``, ``os.fspath`` and every file operation keep the absolute path."""

    def __format__(self, spec: str) -> str:
        return format(shown(self), spec)
