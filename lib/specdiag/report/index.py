"""The index pages: one run's (each notebook with its status, key numbers and findings) and the list of runs.

Rendered with Jinja2 from ``templates/index/`` (``run.html.j2``, ``runs.html.j2``, their ``base.html.j2`` and
``style.css``, inlined: the pages load nothing from the network); this module only gathers what they show.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from specdiag.paths import RUNS_DIR
from specdiag.runs import Run
from specdiag.tables import brief

if TYPE_CHECKING:
    import jinja2

    from specdiag.report.execute import NotebookResult

TEMPLATES = Path(__file__).parent / "templates" / "index"

#: Findings a notebook's cell lists before the rest are collapsed.
FINDINGS_SHOWN = 5
#: Key numbers a notebook's cell shows.
METRICS_SHOWN = 8
#: Characters of a failed notebook's error the index shows.
ERROR_SHOWN = 300


@cache
def _environment() -> jinja2.Environment:
    import jinja2  # noqa: PLC0415

    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def _render(template: str, **context: Any) -> str:
    return _environment().get_template(template).render(**context)


def _finding(f: dict[str, Any]) -> dict[str, str]:
    return {"severity": str(f.get("severity", "info")), "title": str(f.get("title", "")),
            "verdict": str(f.get("verdict", ""))}


def _row(r: NotebookResult) -> dict[str, Any]:
    """A notebook's row: its findings most severe first (the template collapses those beyond
    :data:`FINDINGS_SHOWN`, and all of a recorded run's, ``recorded_from``, under a line naming that run)."""
    from specdiag.findings import SEVERITY_ORDER  # noqa: PLC0415

    found = sorted(r.findings, key=lambda f: SEVERITY_ORDER.get(str(f.get("severity")), 9))
    return {"notebook": r.notebook, "html": r.html, "status": r.status, "error": r.error[:ERROR_SHOWN],
            "duration_s": r.duration_s, "recorded_from": r.recorded_from,
            "metrics": [(k, brief(v)) for k, v in list(r.metrics.items())[:METRICS_SHOWN]],
            "findings": [_finding(f) for f in found]}


def write_run_index(run: Run, results: Sequence[NotebookResult]) -> Path:
    """index.html of one run: each notebook with its status, duration, key numbers and findings."""
    meta = run.meta
    provenance = meta.get("provenance", {})
    server = f"replay of {meta['replay_of']}" if meta.get("replay_of") else meta.get("server_url", "")
    page = _render("run.html.j2", name=run.path.name, server=str(server or ""),
                   created_utc=str(provenance.get("created_utc", "")),
                   version=str(provenance.get("specdiag_version", "")),
                   git_commit=str(provenance.get("git_commit", "")),
                   rows=[_row(r) for r in results], shown=FINDINGS_SHOWN)
    path = run.path / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def write_runs_index(runs_dir: Path = RUNS_DIR) -> Path:
    """data/runs/index.html: every run folder with its time, server and notebook statuses."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for path in sorted((p for p in runs_dir.iterdir() if (p / "run.json").exists()), reverse=True):
        meta = json.loads((path / "run.json").read_text())
        statuses = meta.get("report", {}).get("statuses", {})
        rows.append({"name": path.name, "linked": (path / "index.html").exists(),
                     "target": str(meta.get("server_url") or meta.get("replay_of") or ""),
                     "summary": ", ".join(f"{k}: {v}" for k, v in statuses.items()) or "not run through the report"})
    out = runs_dir / "index.html"
    out.write_text(_render("runs.html.j2", rows=rows), encoding="utf-8")
    return out
