"""What one notebook section shows, built by a library call and shown by the notebook in one line.

A step's page module builds a :class:`Section` per notebook section (its lines of text, tables, figures, and the data
later sections need) and the notebook keeps only parameters, calls and prose::

    s = page.spans(state)   # library: rows, tables, figures, text
    s.show()                # notebook: print, display, plots.show, in the order they were added

``Section.lines`` holds the text lines for tests; ``Section.data`` what the section computed, by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping


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
        from specdiag import tables  # noqa: PLC0415

        self.parts.append(("table", tables.table(rows, columns, **kwargs)))
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
        from IPython.display import HTML, Markdown, display  # noqa: PLC0415

        from specdiag import plots  # noqa: PLC0415

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
