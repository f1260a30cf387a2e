"""The index pages: one run's (what its numbers describe, the answer 07 wrote, then each notebook with its status,
where its numbers come from, its key numbers and findings) and the list of runs.

Rendered with Jinja2 from ``templates/index/`` (``run.html.j2``, ``runs.html.j2``, their ``base.html.j2`` and
``style.css``, inlined: the pages load nothing from the network); this module only gathers what they show.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from specdiag import subject
from specdiag.findings import SEVERITY_ORDER
from specdiag.paths import PROJECT_ROOT, RUNS_DIR
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
#: Keys of a result's metrics the index shows elsewhere (the answer at the top, the forced acceptance beside the
#: numbers) or not at all (07's diagnosis, the whole paragraph: its page has it).
NOT_KEY_NUMBERS = ("lead", "forced_acceptance", "diagnosis", "diagnosis_numbers", "diagnosis_based_on")


@cache
def _environment() -> jinja2.Environment:
    import jinja2  # noqa: PLC0415 - loads jinja2 (costly: ARCHITECTURE.md, Imports)

    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def _render(template: str, **context: Any) -> str:
    return _environment().get_template(template).render(**context)


def _finding(f: dict[str, Any]) -> dict[str, str]:
    return {"severity": str(f.get("severity", "info")), "title": str(f.get("title", "")),
            "verdict": str(f.get("verdict", ""))}


def _meta_of(path: str) -> dict[str, Any]:
    """run.json of a recorded run named by its path under the project ({} when it is not here)."""
    try:
        return dict(Run.open(PROJECT_ROOT / path).meta) if path else {}
    except (FileNotFoundError, ValueError):
        return {}


def _forced_text(forced: Any) -> str:
    """'acceptance forced to 4 (SGLANG_SIMULATE_ACC_LEN) on 5 arms: ...' from a result's ``forced_acceptance``."""
    if not isinstance(forced, dict) or not forced:
        return ""
    values = ", ".join(f"{v:g}" for v in sorted({float(x) for x in forced.values()}))
    return (f"acceptance forced to {values} (SGLANG_SIMULATE_ACC_LEN) on {len(forced)} arm(s): their tokens/s and "
            "token counts are the simulation's, their step times the engine's")


def _row(r: NotebookResult, meta: dict[str, Any], replayed_meta: dict[str, Any]) -> dict[str, Any]:
    """A notebook's row: where its numbers come from, its key numbers (not the answer's lines), its findings most
    severe first (the template folds each verdict, collapses those beyond :data:`FINDINGS_SHOWN`, and all of a recorded
    run's, ``recorded_from``, under a line naming that run)."""
    found = sorted(r.findings, key=lambda f: SEVERITY_ORDER.get(str(f.get("severity")), 9))
    numbers = [(k, brief(v)) for k, v in r.metrics.items() if k not in NOT_KEY_NUMBERS][:METRICS_SHOWN]
    source = subject.measured_on(meta, r.recorded_from, _meta_of(r.recorded_from) if r.recorded_from else replayed_meta)
    return {"notebook": r.notebook, "html": r.html, "status": r.status, "error": r.error[:ERROR_SHOWN],
            "duration_s": r.duration_s, "recorded_from": r.recorded_from, "numbers_from": source,
            "recorded": bool(r.recorded_from), "forced": _forced_text(r.metrics.get("forced_acceptance")),
            "metrics": numbers, "findings": [_finding(f) for f in found]}


def write_run_index(run: Run, results: Sequence[NotebookResult]) -> Path:
    """index.html of one run: what its numbers describe (a demo, a replay), the answer 07 wrote, then each notebook
    with its status, duration, where its numbers come from, key numbers and findings."""
    meta = run.meta
    provenance = meta.get("provenance", {})
    server = f"replay of {meta['replay_of']}" if meta.get("replay_of") else meta.get("server_url", "")
    replayed_meta = _meta_of(str(meta.get("replay_of") or ""))
    banner = subject.run_banner(meta, replayed_meta)
    answer = next((r for r in results if r.notebook == "07_findings"), None)
    page = _render("run.html.j2", name=run.path.name, server=str(server or ""),
                   created_utc=str(provenance.get("created_utc", "")),
                   version=str(provenance.get("specdiag_version", "")),
                   git_commit=str(provenance.get("git_commit", "")),
                   banner=banner, lead=[tuple(x) for x in (answer.metrics.get("lead") or [])] if answer else [],
                   lead_html=answer.html if answer else "",
                   rows=[_row(r, meta, replayed_meta) for r in results], shown=FINDINGS_SHOWN)
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
