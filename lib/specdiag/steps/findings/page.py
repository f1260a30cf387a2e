"""07's page as HTML pieces (pure): the diagnosis first, the findings by severity across notebooks (short cards,
the info and ok ones collapsed), a recorded run's findings apart and collapsed, the key numbers rounded and
collapsed per notebook. Self-contained HTML (no script, style or font from the network)."""

from __future__ import annotations

import html
from typing import Any, Iterable, Mapping, Sequence

from specdiag.findings import SEVERITY_ORDER, to_html
from specdiag.tables import brief
from specdiag.steps.findings.diagnosis import Diagnosis

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
    return (f'<div class="specdiag-diagnosis" style="{_BOX}"><div style="font-size:115%;font-weight:600">Diagnosis</div>'
            f'<p style="margin:6px 0;font-size:105%;line-height:1.45">{_esc(diagnosis.paragraph)}</p>'
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
