"""Which notebooks a report runs, the parameters each gets, and what a recorded run must hold to be replayed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from specdiag.nb import annotation_type, checked_value
from specdiag.paths import NOTEBOOKS_DIR, PROJECT_ROOT
from specdiag.runs import Run

#: Tables a recorded run must hold for a notebook to replay it; None: the notebook never replays.
#: Notebooks not listed replay whenever they are asked to. "a|b" is met by either; a name ending in "/" is a
#: folder of the run that must hold a file (02 draws the torch profiler traces in profiles/ without telemetry);
#: "run.json:key" is a key of the run's run.json that must hold a value (00 and 03 show the server a run recorded:
#: a kernel run, or telemetry of the embedded server, recorded none, and a snapshot of nothing would read as a server
#: without speculative decoding).
REPLAY_NEEDS: dict[str, tuple[str, ...] | None] = {
    "00_snapshot": ("run.json:server",),
    "01_baseline_sweep": ("sweep",),
    "02_gpu_utilization": ("telemetry|step_profile|profiles/",),
    "03_drafter_inspection": ("run.json:server",),
    "04_commit_probe": ("commit_probe",),
    "05_bandwidth_analysis": ("sweep",),
    "06_kernel_ab": ("kernel_ab|kernel_anatomy|kernel_ws_phases",),
    "07_findings": (),
    "08_compare_runs": None,
    "09_engine_ab": ("engine_ab",),
    "10_kv_layout": ("kv_layout",),
    "11_moe_batch1": ("moe_steps|moe_dumps|moe_routing",),
}
#: Notebooks `make report` leaves out by default (08 compares two finished runs: run it by name).
NOT_IN_REPORT = {"08_compare_runs"}
#: Notebooks that read the others' results: a report runs them after every other notebook (07 after 09 too).
RUN_LAST = ("07_findings", "08_compare_runs")


def available_notebooks(notebooks_dir: Path = NOTEBOOKS_DIR) -> list[str]:
    """The notebooks in run order: by number, the ones of :data:`RUN_LAST` after all the others."""
    names = sorted(p.stem for p in notebooks_dir.glob("[0-9][0-9]_*.ipynb"))
    return [n for n in names if n not in RUN_LAST] + [n for n in RUN_LAST if n in names]


def select_notebooks(names: Sequence[str] | None, notebooks_dir: Path = NOTEBOOKS_DIR) -> list[str]:
    """Resolve ``names`` ('04', '04_commit_probe' or '04_commit_probe.ipynb') against the folder."""
    have = available_notebooks(notebooks_dir)
    if not names:
        return [n for n in have if n not in NOT_IN_REPORT]
    out = []
    for raw in names:
        name = Path(raw).stem
        match = [n for n in have if n == name or n.split("_", 1)[0] == name]
        if len(match) != 1:
            raise ValueError(f"no notebook named {raw!r} in {notebooks_dir}; have: {', '.join(have)}")
        out.append(match[0])
    return out


def declared_parameters(notebook_path: Path) -> dict[str, dict[str, Any]]:
    """The names, types and defaults of a notebook's ``parameters`` cell (papermill's reading)."""
    import papermill  # noqa: PLC0415 - heavy import, only when executing

    return dict(papermill.inspect_notebook(str(notebook_path)))


def load_params_file(path: str | None) -> dict[str, Any]:
    """Read a PARAMS YAML file. Top-level keys go to every notebook that declares them; a key that
    names a notebook (``01_baseline_sweep: {...}``) holds parameters for that notebook alone."""
    if not path:
        return {}

    p = Path(path)
    if not p.exists() and (PROJECT_ROOT / p).exists():
        p = PROJECT_ROOT / p
    if not p.exists():
        raise ValueError(f"PARAMS file {path} does not exist; see params/ for examples")
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"PARAMS file {path} must hold a mapping of parameter names to values")
    return data


def parameters_for(notebook: str, declared: Mapping[str, Any], shared: Mapping[str, Any],
                   params_file: Mapping[str, Any]) -> dict[str, Any]:
    """Shared parameters plus the PARAMS file's, restricted to what ``notebook`` declares.

    Raises ValueError for a notebook-specific key the notebook does not declare (a typo would
    otherwise be ignored silently)."""
    out: dict[str, Any] = {}
    for key, value in {**shared, **{k: v for k, v in params_file.items() if not _is_notebook_key(k)}}.items():
        if key in declared:
            out[key] = value
    specific = params_file.get(notebook) or {}
    unknown = sorted(set(specific) - set(declared))
    if unknown:
        raise ValueError(f"PARAMS gives {notebook} parameters it does not declare: {', '.join(unknown)}; "
                         f"it declares: {', '.join(sorted(declared))}")
    out.update(specific)
    return out


def checked_params_file(notebooks: Sequence[str], params_file: Mapping[str, Any], how_to_set: str,
                        notebooks_dir: Path = NOTEBOOKS_DIR) -> dict[str, Any]:
    """The PARAMS file's values checked against the types every notebook to run declares, before any server starts or
    any folder is made: a key naming no notebook, a notebook key the notebook does not declare, or a value of the wrong
    type raises ValueError naming it (``how_to_set``: where the user sets it). Returns the file with context
    parameters given as ``"128k"`` turned into token counts (specdiag.nb.checked_value)."""
    if not params_file:  # the notebooks' own defaults: nothing to check
        return {}
    have = available_notebooks(notebooks_dir)
    strays = sorted(k for k in params_file if _is_notebook_key(k) and k not in have)
    if strays:
        raise ValueError(f"the PARAMS file names {', '.join(strays)}, which is no notebook; have: {', '.join(have)}")
    flat = sorted(k for k, v in params_file.items() if _is_notebook_key(k) and not isinstance(v, Mapping))
    if flat:
        raise ValueError(f"the PARAMS file's {', '.join(flat)} must hold that notebook's parameters as a mapping "
                         "(name: value lines indented under it)")
    out = {k: (dict(v) if _is_notebook_key(k) and isinstance(v, Mapping) else v) for k, v in params_file.items()}
    for nb_name in notebooks:
        declared = declared_parameters(notebooks_dir / f"{nb_name}.ipynb")
        parameters_for(nb_name, declared, {}, params_file)  # a key the notebook does not declare
        specific = out.get(nb_name) if isinstance(out.get(nb_name), dict) else {}
        for key, info in declared.items():
            tp = annotation_type(str(info.get("inferred_type_name") or ""))
            where = f"{how_to_set} (a {nb_name} parameter)"
            if key in specific:
                specific[key] = checked_value(key, specific[key], tp, where)
            elif key in out and not _is_notebook_key(key):
                out[key] = checked_value(key, out[key], tp, where)
    return out


def _is_notebook_key(key: str) -> bool:
    return bool(re.fullmatch(r"\d\d_[A-Za-z0-9_]+", key))


def replay_need_met(source: Run, need: str) -> bool:
    """Whether the recorded run holds one of ``need``'s alternatives (see :data:`REPLAY_NEEDS`)."""
    for alt in need.split("|"):
        if alt.startswith("run.json:"):
            if source.meta.get(alt.split(":", 1)[1]):
                return True
        elif alt.endswith("/"):
            folder = source.path / alt.rstrip("/")
            if folder.is_dir() and any(p.is_file() for p in folder.iterdir()):
                return True
        elif source.rows(alt):
            return True
    return False


def replay_need_text(need: str) -> str:
    """What ``need`` asks for, in words: 'sweep rows', 'files in profiles/', 'recorded server (run.json)'."""
    def one(alt: str) -> str:
        if alt.startswith("run.json:"):
            return f"recorded {alt.split(':', 1)[1]} (run.json)"
        return f"files in {alt}" if alt.endswith("/") else f"{alt} rows"
    return " or ".join(one(a) for a in need.split("|"))
