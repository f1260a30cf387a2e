"""The run folder: run.json, one JSONL per measurement, findings, executed notebooks and HTML.

Layout of ``data/runs/<run-id>/``::

    run.json                 params, provenance, the redacted server snapshot, replay source
    <table>.jsonl            one row per measurement, appended (and fsynced) as soon as it is taken
    findings/<notebook>.json findings and key metrics of one notebook (see ``write_result``)
    findings.json            all notebooks' findings together (written by the report)
    notebooks/*.ipynb        executed notebooks
    html/*.html              code-free reports; index.html lists them

Rows are appended one by one so a run that fails half-way keeps every row it measured;
``done_keys`` lets a re-run with the same ``run_dir`` resume where it stopped.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import hashlib
import json
import os
import platform
import re
import socket
import subprocess
import sys
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from specdiag import __version__
from specdiag.paths import PROJECT_ROOT, RUNS_DIR, ShownPath, relative_to_project
from specdiag.serving.redaction import redact

def _json_default(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (_dt.datetime, _dt.date)):
        return obj.isoformat()
    raise TypeError(f"cannot write {type(obj).__name__} to JSON")


def dumps(obj: Any, **kw: Any) -> str:
    """JSON with numpy/dataclass/Path support and secrets redacted."""
    return json.dumps(redact(obj), default=_json_default, **kw)


def _project_path(path: str | os.PathLike[str]) -> str:
    """A path as a shared file records it: relative to the project (an absolute path inside it made relative; a
    relative one is taken as relative to the project already, whatever the working folder)."""
    p = Path(path)
    return relative_to_project(p) if p.is_absolute() else p.as_posix()


def new_run_id(label: str = "") -> str:
    """``YYYYmmdd-HHMMSS[-label]`` in UTC; label is reduced to [a-z0-9-]."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    label = re.sub(r"[^a-z0-9-]+", "-", label.lower()).strip("-")
    return f"{stamp}-{label}" if label else stamp


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def machine_id() -> str:
    """This machine as one boot of one host: 12 hex digits of a hash of the host name and the kernel's boot id
    (``/proc/sys/kernel/random/boot_id``; the host name alone where there is none). Two calls on one warm lent machine
    share it; a fresh machine (lent machines all call themselves ``vm``) gets another. Reveals neither."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return hashlib.sha256(f"{socket.gethostname()}\n{boot}".encode()).hexdigest()[:12]


def provenance() -> dict[str, Any]:
    """Where and with what this run was made: host, machine (:func:`machine_id`), Python, specdiag version and git
    commit, time."""
    return {
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "machine": machine_id(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "specdiag_version": __version__,
        "git_commit": _git_commit(),
    }


def rows_source(run_meta: Mapping[str, Any]) -> str:
    """Where a run's rows came from: run.json's ``data_source`` (``published`` for reference runs made
    from published tables), else ``measured``."""
    value = run_meta.get("data_source")
    return value if value in ("measured", "server-reported", "computed", "published") else "measured"


class Run:
    """One run folder. Create with :meth:`create` (new or existing folder) or :meth:`open` (existing)."""

    def __init__(self, path: Path) -> None:
        self.path = ShownPath(path)  # f"{run.path}" prints it relative to the project (paths.shown)

    # --- creation -------------------------------------------------------------------------
    @classmethod
    def create(cls, run_dir: str | os.PathLike[str] | None = None, label: str = "", **run_fields: Any) -> "Run":
        """Open ``run_dir`` (created if missing; a relative path is relative to the project root) or a new
        folder under data/runs/.

        ``run_fields`` are merged into run.json at top level (for instance ``params=...``).
        An existing run.json is kept and updated, so notebooks of one run share one folder.
        """
        path = Path(run_dir).expanduser() if run_dir else RUNS_DIR / new_run_id(label)
        if not path.is_absolute():  # relative to the project root, whatever the working folder (papermill
            path = PROJECT_ROOT / path  # runs notebooks in notebooks/), as Run.open reads it
        path.mkdir(parents=True, exist_ok=True)
        run = cls(path)
        if not run.run_json_path.exists():
            run._write_run_json({"run_id": path.name, "provenance": provenance()})
        if run_fields:
            run.update(**run_fields)
        return run

    @classmethod
    def open(cls, run_dir: str | os.PathLike[str]) -> "Run":
        """Open an existing run folder (a recorded or reference run). Raises a clear error if absent."""
        path = Path(run_dir)
        if not path.is_absolute() and not path.exists():
            path = PROJECT_ROOT / path
        if not (path / "run.json").exists():
            raise FileNotFoundError(
                f"{run_dir!s} is not a run folder: it has no run.json. Pass the folder of a recorded run "
                f"(for instance data/reference/ct200-kimi-k26) or leave replay_dir empty to measure."
            )
        return cls(path)

    # --- run.json ---------------------------------------------------------------------------
    @property
    def run_json_path(self) -> Path:
        return self.path / "run.json"

    @property
    def meta(self) -> dict[str, Any]:
        """The contents of run.json."""
        if not self.run_json_path.exists():
            return {}
        return json.loads(self.run_json_path.read_text())

    def _write_run_json(self, data: Mapping[str, Any]) -> None:
        tmp = self.run_json_path.with_suffix(".json.tmp")
        tmp.write_text(dumps(data, indent=2, sort_keys=False) + "\n")
        tmp.replace(self.run_json_path)

    def update(self, **fields: Any) -> dict[str, Any]:
        """Merge ``fields`` into run.json (dict values are merged one level deep). Secrets redacted."""
        data = self.meta
        for key, value in fields.items():
            if isinstance(value, Mapping) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **dict(value)}
            else:
                data[key] = value
        self._write_run_json(data)
        return data

    # --- measurement tables ------------------------------------------------------------------
    def table_path(self, table: str) -> Path:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", table):
            raise ValueError(f"table name {table!r} must be letters, digits, '_', '-' or '.'")
        return self.path / f"{table}.jsonl"

    def append_row(self, table: str, row: Mapping[str, Any]) -> None:
        """Append one row to ``<table>.jsonl`` and flush it to disk at once."""
        line = dumps(dict(row), sort_keys=False)
        with open(self.table_path(table), "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def rows(self, table: str) -> list[dict[str, Any]]:
        """All rows of ``<table>.jsonl`` ([] if none). A torn last line (a crash mid-write) is skipped."""
        path = self.table_path(table)
        if not path.exists():
            return []
        out: list[dict[str, Any]] = []
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def done_keys(self, table: str, key_fields: Iterable[str]) -> set[tuple[Any, ...]]:
        """Keys of rows already measured without error, for resuming an interrupted run."""
        fields = tuple(key_fields)
        return {tuple(r.get(f) for f in fields) for r in self.rows(table) if not r.get("error")}

    # --- findings ------------------------------------------------------------------------------
    def write_result(self, notebook: str, findings: Iterable[Any] = (), metrics: Mapping[str, Any] | None = None,
                     recorded_from: str | os.PathLike[str] | None = None, **extra: Any) -> Path:
        """Write one notebook's findings and key metrics to ``findings/<notebook>.json``.

        ``recorded_from``: the recorded run (a reference run, project-relative) the notebook replayed instead of
        measuring, inside a run that measured the rest live (06 on a machine without a GPU shows a recorded H200
        kernel run). The result then says so (``"recorded_from"``), and 07 shows its findings in their own
        section labelled with that run, out of this run's severity counts and its diagnosis.
        """
        if recorded_from is not None and not str(recorded_from).strip():
            raise ValueError("recorded_from must name the recorded run (e.g. data/reference/kernel-ab-h200) or be None")
        out_dir = self.path / "findings"
        out_dir.mkdir(exist_ok=True)
        payload = {
            "notebook": notebook,
            "written_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "findings": [asdict(f) if is_dataclass(f) else dict(f) for f in findings],
            "metrics": dict(metrics or {}),
            **({"recorded_from": _project_path(recorded_from)} if recorded_from is not None else {}),
            **extra,
        }
        path = out_dir / f"{notebook}.json"
        path.write_text(dumps(payload, indent=2) + "\n")
        return path

    def results(self) -> dict[str, dict[str, Any]]:
        """Every notebook's written result, keyed by notebook name."""
        out_dir = self.path / "findings"
        if not out_dir.is_dir():
            return {}
        return {p.stem: json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json"))}

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"


def recorded_source(notebook: str, result: Mapping[str, Any], run_meta: Mapping[str, Any] | None = None) -> str | None:
    """The recorded run a notebook's result was taken from instead of measuring in this run, or None.

    The result's ``recorded_from`` (:meth:`specdiag.runs.Run.write_result`); for a result written without it, the
    run.json ``replays`` entry of a notebook that replayed another run than the one the whole run replays (a live
    run's 06 showing a recorded kernel run on a machine without a GPU). In a replay of a run (``make replay``) every
    notebook replays that run: those results are the run's own."""
    if result.get("recorded_from"):
        return str(result["recorded_from"])
    meta = run_meta or {}
    replayed = (meta.get("replays") or {}).get(notebook)
    return str(replayed) if replayed and replayed != meta.get("replay_of") else None


def merge_runs(dest: str | os.PathLike[str], sources: Iterable[str | os.PathLike[str]], tables: Iterable[str],
               label: str, list_keys: Iterable[str] = (), first_keys: Iterable[str] = (),
               gzip_files: bool = False, keep_row: Callable[[Mapping[str, Any]], bool] | None = None
               ) -> tuple[Run, list[tuple[int, Run]]]:
    """Join the run folders of several parts of one sweep into ``dest`` (new, or an earlier merge to extend).

    Each source's rows of ``tables`` are appended with ``part`` = its number (counting on from ``dest``'s last part)
    and, where the source's provenance names its machine (:func:`machine_id`), ``machine`` (a row that names its own
    keeps it): which server and machine a row came from is what a comparison across parts needs
    (:mod:`specdiag.spread`);
    each run.json list under ``list_keys`` is joined, its items tagged with their part; a key of ``first_keys`` keeps
    the first value any run has; ``merged_from`` lists the sources. With ``gzip_files``, each source's ``files/`` is
    copied gzipped (the same bytes; a ``.gz`` is copied as it is). With ``keep_row``, only the rows and list items it
    keeps. Returns the merged run and ``(part, source run)``.
    """
    tables, list_keys, first_keys, sources = tuple(tables), tuple(list_keys), tuple(first_keys), list(sources)
    out = Run.create(dest, label=label)
    lists = {k: list(out.meta.get(k) or []) for k in list_keys}
    first = 1 + max([int(r.get("part") or 0) for t in tables for r in out.rows(t)] + [0])
    parts = []
    for part, src in enumerate(sources, start=first):
        run = Run.open(src)
        parts.append((part, run))
        machine = (run.meta.get("provenance") or {}).get("machine")
        stamp = {"part": part, **({"machine": machine} if machine else {})}
        for table in tables:
            for row in run.rows(table):
                if keep_row is None or keep_row(row):
                    out.append_row(table, {**row, **{k: v for k, v in stamp.items() if k == "part" or not row.get(k)}})
        for k in list_keys:
            lists[k] += [{**item, "part": part} for item in run.meta.get(k) or [] if keep_row is None or keep_row(item)]
        for k in first_keys:
            if run.meta.get(k) and not out.meta.get(k):
                out.update(**{k: run.meta[k]})
        for f in sorted((run.path / "files").glob("*")) if gzip_files else ():
            target = out.path / "files" / (f.name if f.suffix == ".gz" else f.name + ".gz")
            target.parent.mkdir(parents=True, exist_ok=True)
            data = f.read_bytes()
            target.write_bytes(data if f.suffix == ".gz" else gzip.compress(data, 9, mtime=0))
    out.update(**lists, merged_from=list(out.meta.get("merged_from") or []) + [str(s) for s in sources])
    return out, parts
