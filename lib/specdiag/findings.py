"""Findings: a verdict with the evidence and numbers that produced it.

Rules that produce findings live next to their analysis (``specdiag.measure.metrics``,
``specdiag.spec``, ``specdiag.steps.bandwidth_analysis.roofline``, ...) and return :class:`Finding` objects; this module
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


def to_html(findings: Iterable[Finding | dict[str, Any]]) -> str:
    """Findings as self-contained HTML (no external assets), for ``IPython.display.HTML``."""
    parts = []
    for f in findings:
        d = f if isinstance(f, dict) else f.__dict__
        color = _BADGE.get(d.get("severity", "info"), "#555")
        ev = "".join(f"<li>{html.escape(str(e))}</li>" for e in d.get("evidence", ()))
        parts.append(
            f'<div style="border-left:6px solid {color};padding:6px 12px;margin:8px 0;background:#fafafa">'
            f'<div><span style="background:{color};color:white;padding:1px 6px;border-radius:3px;'
            f'font-size:85%">{html.escape(d.get("severity", "info").upper())}</span> '
            f'<b>{html.escape(d.get("title", ""))}</b> <code style="color:#777">{html.escape(d.get("id", ""))}</code></div>'
            f'<div style="margin-top:4px">{html.escape(d.get("verdict", ""))}</div>'
            f'<ul style="margin:4px 0">{ev}</ul>'
            f'<div style="color:#777;font-size:85%">source: {html.escape(str(d.get("source", "")))}</div></div>'
        )
    return "\n".join(parts) or "<p><i>No findings.</i></p>"


def to_markdown(findings: Iterable[Finding | dict[str, Any]]) -> str:
    """Findings as Markdown (for the terminal and the summary file)."""
    lines = []
    for f in findings:
        d = f if isinstance(f, dict) else f.__dict__
        lines.append(f"- **[{d.get('severity', 'info').upper()}] {d.get('title', '')}** ({d.get('id', '')}): "
                     f"{d.get('verdict', '')}")
        for e in d.get("evidence", ()):
            lines.append(f"  - {e}")
    return "\n".join(lines)
