"""One way to show rows as a table: pick and label the columns, drop the empty ones, format, hide the index.

Every notebook table is the same idiom (``reindex`` to the wanted columns, ``rename`` to labels with units,
``style.format`` with a precision and per-column formats); it lives here once::

    display(tables.styled(rows, {"context_tokens": "context (tokens)", "step_ms": "ms per step"},
                          precision=3, formats={"context_tokens": "{:,.0f}"}))

Per-column formats are applied after the common precision, column by column, so a format for one column
does not reset the precision of the others (a single dict given to ``Styler.format`` would).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import pandas as pd
from pandas.io.formats.style import Styler


def frame(rows: Iterable[Mapping[str, Any]] | pd.DataFrame, columns: Mapping[str, str],
          drop_empty: bool = True) -> pd.DataFrame:
    """The rows as a DataFrame with exactly ``columns`` (key -> label, in that order), labelled; columns that
    are missing or all empty are dropped when ``drop_empty`` (a replayed publication has only some)."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    out = df.reindex(columns=list(columns)).rename(columns=dict(columns))
    return out.dropna(axis=1, how="all") if drop_empty else out


def styled(rows: Iterable[Mapping[str, Any]] | pd.DataFrame, columns: Mapping[str, str], precision: int = 3,
           formats: Mapping[str, str] | None = None, drop_empty: bool = True, na_rep: str = "-") -> Styler:
    """:func:`frame`, styled: ``precision`` decimals and thousands separators everywhere, then ``formats``
    (column key -> format string, e.g. ``"{:.0%}"``) on their columns; empty cells show ``na_rep``."""
    df = frame(rows, columns, drop_empty)
    style = df.style.format(precision=precision, na_rep=na_rep, thousands=",").hide(axis="index")
    for key, fmt in (formats or {}).items():
        label = columns.get(key)
        if label is None:
            raise KeyError(f"format given for {key!r}, which is not one of the table's columns {list(columns)}")
        if label in df.columns:
            style = style.format(fmt, subset=[label], na_rep=na_rep)
    return style
