"""Offline HTML of executed notebooks, the run's findings.json, and the check that a page loads nothing from the network."""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path

from specdiag.paths import RUNS_DIR
from specdiag.report.execute import NotebookResult
from specdiag.report.index import write_run_index, write_runs_index
from specdiag.report.outputs import fold_long_logs, plain_progress
from specdiag.runs import Run, dumps, recorded_source

TEMPLATES_DIR = Path(__file__).parent / "templates" / "nbconvert"
TEMPLATE_NAME = "specdiag_offline"
#: How a notebook that ran but whose page did not render is marked; `specdiag report render` renders it again.
RENDER_FAILED = "HTML rendering failed"


def render_html(ipynb_path: Path, html_path: Path) -> None:
    """Code-free HTML that opens offline (our template drops the CDN scripts), progress bars as plain lines."""
    import nbformat  # noqa: PLC0415 - loads nbformat (costly: ARCHITECTURE.md, Imports)
    from nbconvert import HTMLExporter  # noqa: PLC0415 - loads nbconvert (costly: ARCHITECTURE.md, Imports)
    from nbconvert.preprocessors import TagRemovePreprocessor  # noqa: PLC0415 - loads nbconvert (costly: ARCHITECTURE.md, Imports)

    exporter = HTMLExporter(template_name=TEMPLATE_NAME, extra_template_basedirs=[str(TEMPLATES_DIR)])
    exporter.exclude_input = True
    exporter.exclude_input_prompt = True
    exporter.exclude_output_prompt = True
    exporter.register_preprocessor(
        TagRemovePreprocessor(remove_cell_tags={"remove-cell"}, remove_input_tags={"remove-input"},
                              remove_all_outputs_tags={"remove-output"}, enabled=True), enabled=True)
    nb = nbformat.read(str(ipynb_path), as_version=4)
    nb.metadata.pop("widgets", None)
    plain_progress(nb)  # progress bars: one plain line each, not red stderr blocks
    fold_long_logs(nb)  # a measuring log under one line: the page leads with its answer
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": ipynb_path.stem}})
    html_path.parent.mkdir(parents=True, exist_ok=True)
    html_path.write_text(body, encoding="utf-8")


_NET_ATTR = re.compile(r"""<(?P<tag>[a-zA-Z]+)\b[^>]*?\b(?P<attr>src|href|data)\s*=\s*["']?(?P<url>(?:https?:)?//[^"'\s>]+)""",
                       re.IGNORECASE)
_NET_CSS = re.compile(r"""(?:@import\s+(?:url\()?|url\()\s*["']?(?P<url>(?:https?:)?//[^"')\s]+)""", re.IGNORECASE)


def network_references(html_text: str) -> list[str]:
    """Every network URL an HTML page would load: src/href/data attributes and CSS url()/@import.

    Plain text links (``<a href="https://...">``) are not loads and are allowed."""
    refs = [m.group("url") for m in _NET_ATTR.finditer(html_text) if m.group("tag").lower() != "a"]
    refs += [m.group("url") for m in _NET_CSS.finditer(html_text)]
    return refs


def collect_results(run: Run, results: list[NotebookResult]) -> None:
    """Attach each notebook's recorded metrics and findings, write findings.json and the run's statuses."""
    written = run.results()
    for r in results:
        rec = written.get(r.notebook, {})
        r.metrics = dict(rec.get("metrics", {}))
        r.findings = list(rec.get("findings", []))
        r.recorded_from = recorded_source(r.notebook, rec, run.meta) or "" if rec else ""
    (run.path / "findings.json").write_text(dumps({r.notebook: {"status": r.status, "findings": r.findings,
                                                                 "metrics": r.metrics,
                                                                 **({"recorded_from": r.recorded_from}
                                                                    if r.recorded_from else {})} for r in results},
                                                  indent=2) + "\n")
    run.update(report={"statuses": {r.notebook: r.status for r in results},
                       "results": [asdict(r) | {"findings": len(r.findings)} for r in results]})


def render_run(run: Run, results: list[NotebookResult]) -> Path:
    """HTML for every executed notebook, then the run's index and the runs index."""
    for r in results:
        if not r.ipynb:
            continue
        html_rel = f"html/{r.notebook}.html"
        try:
            render_html(run.path / r.ipynb, run.path / html_rel)
            r.html = html_rel
        except Exception as exc:  # noqa: BLE001 - a render failure marks the notebook, the rest go on
            r.status = "failed"
            r.error = (r.error + "; " if r.error else "") + f"{RENDER_FAILED}: {exc}"
    collect_results(run, results)
    index = write_run_index(run, results)
    write_runs_index(run.path.parent if run.path.parent.resolve() == RUNS_DIR.resolve() else RUNS_DIR)
    return index
