"""The index pages: one run's (each notebook with its status, key numbers and findings) and the list of runs."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from specdiag.paths import RUNS_DIR
from specdiag.runs import Run
from specdiag.steps.findings.page import brief

if TYPE_CHECKING:
    from specdiag.report.execute import NotebookResult

_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;max-width:1200px;color:#222}
table{border-collapse:collapse;width:100%}th,td{border-bottom:1px solid #ddd;padding:6px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.ok{color:#2e7d32;font-weight:600}.failed{color:#c62828;font-weight:600}.skipped{color:#777}
code{background:#f5f5f5;padding:0 3px}.sev-critical{color:#c62828}.sev-warning{color:#ef6c00}.sev-ok{color:#2e7d32}
.sev-info{color:#1565c0}small{color:#666}"""


#: Findings a notebook's cell lists before the rest are collapsed.
FINDINGS_SHOWN = 5


def _findings_cell(r: NotebookResult) -> str:
    """A notebook's findings in the index: most severe first, the rest beyond :data:`FINDINGS_SHOWN` collapsed; a
    recorded run's (``recorded_from``) collapsed under a line naming that run."""
    from specdiag.findings import SEVERITY_ORDER  # noqa: PLC0415

    found = sorted(r.findings, key=lambda f: SEVERITY_ORDER.get(str(f.get("severity")), 9))
    items = [f'<li class="sev-{html.escape(f.get("severity", "info"))}">[{html.escape(f.get("severity", "").upper())}] '
             f'{html.escape(f.get("title", ""))}: {html.escape(f.get("verdict", ""))}</li>' for f in found]
    if r.recorded_from:
        return (f"<details><summary><small>{len(items)} findings of the recorded run "
                f"<code>{html.escape(r.recorded_from)}</code>: not measured in this run, not counted</small></summary>"
                f"<ul>{''.join(items)}</ul></details>")
    shown, rest = items[:FINDINGS_SHOWN], items[FINDINGS_SHOWN:]
    more = f"<details><summary><small>{len(rest)} more</small></summary><ul>{''.join(rest)}</ul></details>" if rest else ""
    return f"<ul>{''.join(shown)}</ul>{more}"


def write_run_index(run: Run, results: Sequence[NotebookResult]) -> Path:
    """index.html of one run: each notebook with its status, duration, key numbers and findings."""
    meta = run.meta
    rows = []
    for r in results:
        metrics = "<br>".join(f"<code>{html.escape(k)}</code> = {html.escape(brief(v))}"
                              for k, v in list(r.metrics.items())[:8]) or "<small>none recorded</small>"
        fnd = _findings_cell(r)
        link = f'<a href="{html.escape(r.html)}">{html.escape(r.notebook)}</a>' if r.html else html.escape(r.notebook)
        err = f"<br><small>{html.escape(r.error[:300])}</small>" if r.error else ""
        rows.append(f'<tr><td>{link}</td><td class="{r.status}">{r.status}{err}</td><td>{r.duration_s:.1f}</td>'
                    f"<td>{metrics}</td><td>{fnd}</td></tr>")
    server = f"replay of {meta['replay_of']}" if meta.get("replay_of") else meta.get("server_url", "")
    page = f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>specdiag run {html.escape(run.path.name)}</title>
<style>{_CSS}</style></head><body>
<h1>specdiag run <code>{html.escape(run.path.name)}</code></h1>
<p>Server: <code>{html.escape(str(server or ''))}</code> &middot; created {html.escape(str(meta.get('provenance', {}).get('created_utc', '')))}
&middot; specdiag {html.escape(str(meta.get('provenance', {}).get('specdiag_version', '')))}
(git {html.escape(str(meta.get('provenance', {}).get('git_commit', '')))})</p>
<p>Numbers below are the notebooks' key metrics; each notebook's page says which are measured,
server-reported, computed or published. Raw rows: the <code>*.jsonl</code> files of this folder.</p>
<table><tr><th>notebook</th><th>status</th><th>time (s)</th><th>key numbers</th><th>findings</th></tr>
{''.join(rows)}</table>
<p><small>Files: <a href="run.json">run.json</a> &middot; <a href="findings.json">findings.json</a>
&middot; <a href="../index.html">all runs</a></small></p>
</body></html>"""
    path = run.path / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def write_runs_index(runs_dir: Path = RUNS_DIR) -> Path:
    """data/runs/index.html: every run folder with its time, server and notebook statuses."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for path in sorted((p for p in runs_dir.iterdir() if (p / "run.json").exists()), reverse=True):
        meta = json.loads((path / "run.json").read_text())
        report = meta.get("report", {})
        statuses = report.get("statuses", {})
        summary = ", ".join(f"{k}: {v}" for k, v in statuses.items()) or "not run through the report"
        target = meta.get("server_url") or meta.get("replay_of") or ""
        link = f'<a href="{html.escape(path.name)}/index.html">{html.escape(path.name)}</a>' \
            if (path / "index.html").exists() else html.escape(path.name)
        rows.append(f"<tr><td>{link}</td><td>{html.escape(str(target))}</td><td>{html.escape(summary)}</td></tr>")
    page = f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>specdiag runs</title>
<style>{_CSS}</style></head><body><h1>specdiag runs</h1>
<table><tr><th>run</th><th>server or recorded run</th><th>notebooks</th></tr>{''.join(rows)}</table></body></html>"""
    out = runs_dir / "index.html"
    out.write_text(page, encoding="utf-8")
    return out
