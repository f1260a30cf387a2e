"""What one notebook section shows, built by a library call and shown by the notebook in one line.

A step's page module builds a :class:`Section` per notebook section (its lines of text, tables, figures, and the data
later sections need) and the notebook keeps only parameters, calls and prose::

    s = page.spans(state)   # library: rows, tables, figures, text
    s.show()                # notebook: print, display, plots.show, in the order they were added

``Section.lines`` holds the text lines for tests; ``Section.data`` what the section computed, by name.
"""

from __future__ import annotations

import html as _html
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

#: The lead box: the page's answer before its evidence (a few short labelled lines).
_LEAD_BOX = ("border:2px solid #37474f;border-radius:5px;padding:10px 16px;margin:10px 0 16px 0;background:#fbfcfd;"
             "max-width:1240px")


def lead_html(lines: Sequence[tuple[str, str]], title: str = "The answer") -> str:
    """A page's answer first: ``title`` over a few short labelled lines (symptom, cause, what to run, what it buys, how
    sure), each line escaped. Self-contained HTML."""
    cell = "border:none;text-align:left;vertical-align:top;"
    rows = "".join(f'<tr style="background:none"><td style="{cell}padding:2px 14px 2px 0;white-space:nowrap;'
                   f'font-weight:600">{_html.escape(label)}</td><td style="{cell}padding:2px 0;line-height:1.4">'
                   f'{_html.escape(text)}</td></tr>' for label, text in lines)
    return (f'<div class="specdiag-lead" style="{_LEAD_BOX}"><div style="font-size:118%;font-weight:700;'
            f'margin-bottom:4px">{_html.escape(title)}</div><table style="border:none;font-size:105%;margin:0">{rows}</table>'
            "</div>")


@dataclass
class Section:
    """The parts of a section in order (``("text", str)``, ``("markdown", str)``, ``("html", str)``,
    ``("table", Styler)``, ``("figure", Figure)``) and what it computed (``data``)."""

    parts: list[tuple[str, Any]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def text(self, line: str) -> "Section":
        self.parts.append(("text", str(line)))
        return self

    def markdown(self, text: str) -> "Section":
        self.parts.append(("markdown", str(text)))
        return self

    def html(self, text: str) -> "Section":
        self.parts.append(("html", str(text)))
        return self

    def table(self, rows: Iterable[Mapping[str, Any]] | Any, columns: Mapping[Any, str] | None = None,
              **kwargs: Any) -> "Section":
        """A table of ``rows`` through :func:`specdiag.tables.table` (same arguments)."""
        from specdiag import tables  # noqa: PLC0415 - loads pandas (costly: ARCHITECTURE.md, Imports)

        self.parts.append(("table", tables.table(rows, columns, **kwargs)))
        return self

    def lead(self, lines: Sequence[tuple[str, str]], title: str = "The answer") -> "Section":
        """The page's answer first (:func:`lead_html`); its lines are kept as text too (``lines``)."""
        self.parts.append(("html", lead_html(lines, title)))
        self.data["lead"] = [list(x) for x in lines]
        return self

    def figure(self, fig: Any) -> "Section":
        self.parts.append(("figure", fig))
        return self

    @property
    def lines(self) -> list[str]:
        """The text and markdown lines, in order."""
        return [p for kind, p in self.parts if kind in ("text", "markdown")]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def show(self) -> None:
        """Print the text, display tables, markdown and HTML, show each figure once (and close it)."""
        from IPython.display import HTML, Markdown, display  # noqa: PLC0415 - loads IPython (costly: ARCHITECTURE.md, Imports)

        from specdiag import plots  # noqa: PLC0415 - loads matplotlib (costly: ARCHITECTURE.md, Imports)

        for kind, part in self.parts:
            if kind == "text":
                print(part)
            elif kind == "markdown":
                display(Markdown(part))
            elif kind == "html":
                display(HTML(part))
            elif kind == "figure":
                plots.show(part)
            else:
                display(part)
