"""Notebook 07's page: :func:`start` opens the run whose findings it gathers (a :class:`Page`, whose data are read when
a section first asks); the sections, one call each: :func:`diagnosis` (the verdict first, then the diagnosis),
:func:`findings` (by severity across notebooks, short cards, the info and ok ones collapsed, a recorded run's apart),
:func:`answered` (what each notebook answered), :func:`key_numbers` (rounded, collapsed per notebook),
:func:`closing` and :func:`write_result`. The HTML pieces below them are pure and self-contained (no script, style or
font from the network)."""

from __future__ import annotations

import html
from functools import cached_property
from typing import Any, Iterable, Mapping, Sequence

from specdiag import nb, tables
from specdiag.findings import SEVERITY_ORDER, Finding, to_html
from specdiag.section import Section
from specdiag.steps.findings import ddtree, overview, run_checks
from specdiag.steps.findings import lead as leads
from specdiag.steps.findings.diagnosis import Diagnosis, diagnose
from specdiag.tables import brief

NOTEBOOK = "07_findings"

#: Severities a reader sees expanded; the rest sit under one collapsed line.
SHOWN = ("critical", "warning")

_BOX = "border:1px solid #ccc;border-radius:4px;padding:10px 14px;margin:8px 0 14px 0;background:#fcfcfc"


def _esc(text: Any) -> str:
    return html.escape(str(text))


def counts(findings: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    found = list(findings)
    return {s: sum(1 for f in found if f.get("severity") == s) for s in ("critical", "warning", "info", "ok")}


def diagnosis_html(diagnosis: Diagnosis, findings: Sequence[Mapping[str, Any]],
                   recorded: Mapping[str, str] | None = None) -> str:
    """The opening box: the diagnosis paragraph, then one line of counts (this run's findings only) and, when a
    notebook showed a recorded run, that it is not counted."""
    c = counts(findings)
    tally = (f"This run: {c['critical']} critical, {c['warning']} {'warning' if c['warning'] == 1 else 'warnings'}, "
             f"{c['info'] + c['ok']} info or ok, in {len({f.get('notebook') for f in findings})} notebooks.")
    rec = "".join(f" {_esc(nb)} showed the recorded run <code>{_esc(src)}</code>, not a measurement of this run: "
                  f"its findings are listed apart and not counted." for nb, src in (recorded or {}).items())
    basis = ", ".join(diagnosis.based_on) or "no finding of this run"
    return (f'<div class="specdiag-diagnosis" style="{_BOX}"><details><summary style="cursor:pointer;font-size:110%;'
            f'font-weight:600">The diagnosis in full, sentence by sentence with its source</summary>'
            f'<p style="margin:6px 0;font-size:105%;line-height:1.45">{_esc(diagnosis.paragraph)}</p></details>'
            f'<div style="color:#555;font-size:85%">{_esc(tally)}{rec} Built from: {_esc(basis)}.</div></div>')


def findings_html(findings: Sequence[Mapping[str, Any]]) -> str:
    """This run's findings, most severe first across notebooks: critical and warning as cards (evidence collapsed),
    info and ok under one collapsed line."""
    ordered = sorted(findings, key=lambda f: SEVERITY_ORDER.get(str(f.get("severity")), 9))
    top = [f for f in ordered if f.get("severity") in SHOWN]
    rest = [f for f in ordered if f.get("severity") not in SHOWN]
    out = to_html(top, collapse_over=0, show_notebook=True) if top else \
        "<p><i>No critical or warning finding in this run.</i></p>"
    if rest:
        c = counts(rest)
        out += (f'<details style="margin:8px 0"><summary style="cursor:pointer">{len(rest)} more: {c["info"]} info, '
                f'{c["ok"]} ok</summary>{to_html(rest, collapse_over=0, show_notebook=True)}</details>')
    return out


def recorded_html(results: Mapping[str, Mapping[str, Any]], recorded: Mapping[str, str]) -> str:
    """One collapsed section per notebook that showed a recorded run: its findings, labelled with that run."""
    parts = []
    for name, source in recorded.items():
        found = sorted(((results.get(name) or {}).get("findings") or []),
                       key=lambda f: SEVERITY_ORDER.get(str(f.get("severity")), 9))
        c = counts(found)
        label = f"recorded run {source}"
        parts.append(
            f'<details class="specdiag-recorded" style="margin:8px 0;padding:4px 10px;border:1px dashed #bbb">'
            f'<summary style="cursor:pointer"><b>{_esc(name)}</b>: {len(found)} findings of the recorded run '
            f'<code>{_esc(source)}</code> ({c["critical"]} critical, {c["warning"]} warning), not measured in this '
            f'run and not counted above</summary>'
            f'{to_html([{**f, "notebook": name} for f in found], collapse_over=0, show_notebook=True, note=label)}'
            f'</details>')
    return "".join(parts)


def metrics_html(results: Mapping[str, Mapping[str, Any]], recorded: Mapping[str, str] | None = None) -> str:
    """Each notebook's key numbers, rounded, one collapsed section per notebook (the full values stay in
    ``findings/<notebook>.json``)."""
    parts = []
    for name in sorted(results):
        metrics = (results[name] or {}).get("metrics") or {}
        if not metrics:
            continue
        rows = "".join(f'<tr><td style="padding:1px 10px 1px 0"><code>{_esc(k)}</code></td>'
                       f'<td style="padding:1px 0">{_esc(brief(v))}</td></tr>' for k, v in metrics.items())
        tag = f" (recorded run {_esc((recorded or {})[name])})" if name in (recorded or {}) else ""
        parts.append(f'<details style="margin:4px 0"><summary style="cursor:pointer">{_esc(name)}{tag}: '
                     f'{len(metrics)} numbers</summary><table style="font-size:90%">{rows}</table>'
                     f'<div style="color:#777;font-size:80%">full values: findings/{_esc(name)}.json</div></details>')
    return "".join(parts) or "<p><i>No notebook recorded key numbers in this run.</i></p>"


class Page(nb.Page):
    """What 07's sections share: the run's results (this run's own, and those taken from a recorded run), the
    findings across notebooks with the run-level ones, the diagnosis and the per-notebook overview."""

    notebook = NOTEBOOK

    def __init__(self, params: Mapping[str, Any]) -> None:
        super().__init__(params)
        p = self.params
        nb.check(bool(p["run_dir"]), "run_dir is empty: name the run folder whose findings to gather, e.g. "
                                     "data/runs/<run-id>")
        self.versions = nb.versions()  # shown at the end of the page: the diagnosis comes first
        self.ctx = nb.start(NOTEBOOK, server_url="", run_dir=p["run_dir"], replay_dir=p["replay_dir"],
                            params=nb.run_params(p), needs_server=False)

    @cached_property
    def results(self) -> dict[str, Mapping[str, Any]]:
        """Every notebook's result in the run but the summaries'."""
        return {k: v for k, v in self.ctx.run.results().items() if k not in overview.SUMMARY_NOTEBOOKS}

    @property
    def statuses(self) -> dict[str, Any]:
        """Each notebook's status in the report, when ``make report`` made the run."""
        return (self.ctx.run.meta.get("report") or {}).get("statuses") or {}

    @cached_property
    def _split(self) -> tuple[dict[str, Mapping[str, Any]], dict[str, str]]:
        return overview.split_recorded(self.results, self.ctx.run.meta)  # a recorded run's findings are not this run's

    @property
    def recorded(self) -> dict[str, str]:
        """{notebook: recorded run} of the notebooks that showed a recorded run instead of measuring."""
        return self._split[1]

    @cached_property
    def run_level(self) -> list[dict[str, Any]]:
        """The run as a whole: which notebooks saw which server (restarts, other settings), how much ran beside other
        traffic; and DDTree (in no engine release): what this run's servers and the plugin's calls measured of its
        parts, and what not."""
        meta = self.ctx.run.meta
        found = run_checks.run_findings(meta, overview.collect_findings(self._split[0]))
        note = ddtree.ddtree_finding(meta, ddtree.recorded_metas(meta))
        return found + ([ddtree.as_listed(note)] if note else [])

    @cached_property
    def found(self) -> list[dict[str, Any]]:
        """This run's findings, most severe first across notebooks, the run-level ones among them."""
        return overview.sort_collected(overview.collect_findings(self._split[0]) + self.run_level)

    @cached_property
    def diag(self) -> Diagnosis:
        return diagnose(self.found)

    @cached_property
    def lead(self) -> list[tuple[str, str]]:
        """The answer in a few lines (:mod:`.lead`): symptom, cause, what to run, what it buys, how sure."""
        return leads.lead_lines(self.diag, self.found, self.results)

    @cached_property
    def overview(self) -> list[dict[str, Any]]:
        """One row per notebook: result, status, counts per severity, most severe verdict."""
        return overview.notebook_overview(self.results, self.statuses, self.recorded)

    @cached_property
    def summary(self) -> Finding:
        return overview.overall_finding(self.found, self.overview)


def start(params: Mapping[str, Any]) -> Page:
    """Check that a run folder is named and open it (:class:`Page`)."""
    return Page(params)


def diagnosis(pg: Page) -> Section:
    """The page's opening: what its numbers describe (a demo, a replay), the answer in a few lines, then the diagnosis
    in full, built from this run's findings."""
    s = pg.opening
    s.lead(pg.lead, title=leads.TITLE)
    return s.html(diagnosis_html(pg.diag, pg.found, pg.recorded))


def findings(pg: Page) -> Section:
    """Section 1: this run's findings, most severe first across notebooks; a recorded run's apart."""
    s = Section().html(findings_html(pg.found))
    return s.html(recorded_html(pg.results, pg.recorded)) if pg.recorded else s


OVERVIEW_COLUMNS = {"notebook": "notebook", "question": "question", "result": "result", "status": "status",
                    "critical": "critical", "warning": "warning", "info": "info", "ok": "ok",
                    "most severe": "most severe"}


def answered(pg: Page) -> Section:
    """Section 2: one line per notebook: its result, status, counts per severity and most severe verdict."""
    columns = {k: v for k, v in OVERVIEW_COLUMNS.items() if k != "status" or pg.statuses}
    return Section().table(pg.overview, columns, dash_means="a recorded run's findings, not counted as this run's")


def key_numbers(pg: Page) -> Section:
    """Section 3: each notebook's key numbers, rounded, collapsed per notebook."""
    return Section().html(metrics_html(pg.results, pg.recorded))


def closing(pg: Page) -> Section:
    """The run folder and the versions (at the end: the diagnosis comes first)."""
    meta = pg.ctx.run.meta
    return (Section().text(f"run folder: {pg.ctx.run.path}"
                           + (f" (replay of {meta['replay_of']})" if meta.get("replay_of") else ""))
            .text("versions: " + ", ".join(f"{k} {v}" for k, v in pg.versions.items())))


def write_result(pg: Page) -> Any:
    """07's result: the diagnosis, the summary and the run-level findings, and the diagnosis' numbers."""
    return pg.ctx.run.write_result(NOTEBOOK, findings=[pg.diag.as_finding(), pg.summary, *pg.run_level], metrics={
        **pg.summary.numbers, "diagnosis": pg.diag.paragraph, "diagnosis_numbers": pg.diag.numbers,
        "diagnosis_based_on": list(pg.diag.based_on), "lead": [list(x) for x in pg.lead]})
