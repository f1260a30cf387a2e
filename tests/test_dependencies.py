"""pyproject.toml (pip) and environment.yml (conda) must list the same dependencies."""

from __future__ import annotations

import re
import tomllib

import yaml

from specdiag.paths import PROJECT_ROOT

# conda package names that differ from PyPI's
CONDA_TO_PYPI = {"pytorch": "torch"}
NOT_DEPENDENCIES = {"python", "pip"}


def _name(spec: str) -> str:
    return re.split(r"[<>=!~\[ ;]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject() -> dict[str, str]:
    data = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    return {_name(s): s.replace(" ", "") for s in data["project"]["dependencies"]}


def _environment() -> dict[str, str]:
    data = yaml.safe_load((PROJECT_ROOT / "environment.yml").read_text())
    out = {}
    for dep in data["dependencies"]:
        if isinstance(dep, str):
            name = CONDA_TO_PYPI.get(_name(dep), _name(dep))
            if name not in NOT_DEPENDENCIES:
                out[name] = name + dep.replace(" ", "")[len(_name(dep)):]
    return out


def test_same_packages() -> None:
    pip, conda = _pyproject(), _environment()
    assert sorted(set(pip) - set(conda)) == [], "in pyproject.toml but not environment.yml"
    assert sorted(set(conda) - set(pip)) == [], "in environment.yml but not pyproject.toml"


def test_same_version_bounds() -> None:
    pip, conda = _pyproject(), _environment()
    assert {k: pip[k] for k in pip} == {k: conda[k] for k in pip}


def test_issue_dependencies_present() -> None:
    required = {"jupyterlab", "papermill", "matplotlib", "seaborn", "requests", "nvidia-ml-py", "pandas", "tqdm",
                "transformers", "torch", "fastapi", "uvicorn"}
    assert required <= set(_pyproject())


def test_sglang_is_optional_only() -> None:
    data = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())
    assert "sglang" not in {_name(s) for s in data["project"]["dependencies"]}
    assert any(_name(s) == "sglang" for s in data["project"]["optional-dependencies"]["sglang"])
