"""Findings: a verdict with the evidence and numbers that produced it.

Rules that produce findings live next to their analysis (``specdiag.measure.metrics``,
``specdiag.speculation``, ``specdiag.prefill``, ...) and return :class:`Finding` objects; this module
holds the dataclass and its rendering.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

Severity = Literal["ok", "info", "warning", "critical"]
#: Where a number came from. Every number on a page says one of these.
Source = Literal["measured", "server-reported", "computed", "published", "configured", "parameter"]

SEVERITY_ORDER: dict[str, int] = {"critical": 0, "warning": 1, "info": 2, "ok": 3}


@dataclass(frozen=True)
class Finding:
    """One verdict of one notebook.

    id:       stable dotted name, e.g. ``sweep.step_time_slope``
    title:    short heading
    verdict:  one or two sentences a reader can act on
    severity: ok (healthy), info, warning, critical
    evidence: sentences stating the numbers (with units and their source) that led to the verdict
    numbers:  the same numbers, machine-readable; keys carry units (``slope_ms_per_1k_tokens``)
    source:   where the deciding numbers came from (measured, server-reported, computed, published,
              configured, or parameter: a value the user passed)
    """

    id: str
    title: str
    verdict: str
    severity: Severity = "info"
    evidence: tuple[str, ...] | list[str] = field(default_factory=tuple)
    numbers: dict[str, Any] = field(default_factory=dict)
    source: Source = "measured"


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Most severe first, stable otherwise."""
    return sorted(findings, key=lambda f: SEVERITY_ORDER.get(f.severity, 9))


_BADGE = {"ok": "#2e7d32", "info": "#1565c0", "warning": "#ef6c00", "critical": "#c62828"}
#: Evidence lists longer than this are collapsed under their count (``to_html``'s default).
COLLAPSE_OVER = 4


def _card(d: dict[str, Any], collapse_over: int, show_notebook: bool, note: str) -> str:
    color = _BADGE.get(d.get("severity", "info"), "#555")
    evidence = [str(e) for e in d.get("evidence", ())]
    items = "".join(f"<li>{html.escape(e)}</li>" for e in evidence)
    ev = ""
    if evidence:
        ev = (f'<ul style="margin:4px 0">{items}</ul>' if len(evidence) <= collapse_over else
              f'<details style="margin-top:2px"><summary style="cursor:pointer;color:#555">evidence '
              f'({len(evidence)} {"line" if len(evidence) == 1 else "lines"})</summary>'
              f'<ul style="margin:4px 0">{items}</ul></details>')
    where = " · ".join(html.escape(str(x)) for x in (
        d.get("notebook") if show_notebook else None, d.get("source"), note or None) if x)
    return (f'<div class="specdiag-finding sev-{html.escape(d.get("severity", "info"))}" '
            f'style="border-left:5px solid {color};padding:4px 10px;margin:6px 0;background:#fafafa">'
            f'<div><span style="background:{color};color:white;padding:0 6px;border-radius:3px;font-size:80%">'
            f'{html.escape(d.get("severity", "info").upper())}</span> <b>{html.escape(d.get("title", ""))}</b>'
            f' <span style="color:#777;font-size:85%">{where}</span></div>'
            f'<div style="margin-top:2px">{html.escape(d.get("verdict", ""))}</div>{ev}'
            f'<div style="color:#999;font-size:75%">{html.escape(d.get("id", ""))}</div></div>')


def to_html(findings: Iterable[Finding | dict[str, Any]], collapse_over: int = COLLAPSE_OVER,
            show_notebook: bool = False, note: str = "") -> str:
    """Findings as self-contained HTML cards (no external assets), for ``IPython.display.HTML``: severity, title,
    verdict, the evidence (collapsed under its count when longer than ``collapse_over`` lines; 0 collapses every
    list), the id. ``show_notebook``: name each finding's notebook (07's cards gather several); ``note``: a label
    on every card (07's recorded-run sections)."""
    parts = [_card(f if isinstance(f, dict) else dict(f.__dict__), collapse_over, show_notebook, note)
             for f in findings]
    return "\n".join(parts) or "<p><i>No findings.</i></p>"
