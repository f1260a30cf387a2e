"""One way to show rows as a table: pick and label the columns, drop the empty ones, round, hide the index.

Every notebook table goes through :func:`table` (``styled`` is the same with a fixed number of decimals)::

    display(tables.table(rows, {"context_tokens": "context (tokens)", "step_ms": "ms per step"},
                         formats={"share": "{:.0%}"}))

What it does, so that no notebook prints a raw pandas frame:

- no index column: a frame with a named index (a pivot table, ``set_index``) shows it as ordinary leading
  columns, named as the index levels were; an unnamed index (row numbers) is not shown;
- headers that are numbers (contexts as the columns of a pivot) read as contexts do everywhere else: 1k, 32k,
  128k (:func:`specdiag.plots.format_tokens`; whole numbers below 1,000 as plain integers, never '65536.0');
- numbers rounded per column to what they mean: a column of whole numbers shows whole numbers with thousands
  separators; any other numeric column gets :data:`DIGITS` significant digits at its typical (median) size, the
  same decimals down the column; a column of mixed values (a settings table) rounds each number by itself;
  ``formats`` (column key -> format string or function) overrides a column; text columns align left;
- an empty cell (None, NaN) shows a dash, and the table then carries a note below it saying what a dash means.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Iterable, Mapping

import pandas as pd
from pandas.io.formats.style import Styler

#: Significant digits a numeric column is rounded to, at its median magnitude.
DIGITS = 3
#: The most decimals a column gets, however small its numbers.
MAX_DECIMALS = 6
#: What an empty cell shows.
DASH = "-"
#: What a dash means unless the table says otherwise.
DASH_MEANS = "no value: not measured, not reported, or not applicable to this row"
#: Most list items a cell shows before '...'.
LIST_ITEMS = 6

Format = str | Callable[[Any], str]


def frame(rows: Iterable[Mapping[str, Any]] | pd.DataFrame, columns: Mapping[Any, str] | None = None,
          drop_empty: bool = True) -> pd.DataFrame:
    """The rows as a DataFrame with exactly ``columns`` (key -> label, in that order; None: every column),
    labelled; columns that are missing or all empty are dropped when ``drop_empty`` (a replayed publication has
    only some). A frame's named index (a pivot's, ``set_index``'s) becomes leading columns, an unnamed one is
    dropped (row numbers); multi-level column headers are joined with a space."""
    df = rows.copy() if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if isinstance(df.columns, pd.MultiIndex):
        df.columns = [" ".join(str(x) for x in c if str(x) != "") for c in df.columns]
    if any(n is not None for n in df.index.names):  # a named index (a pivot's, set_index's) is data: show it
        df = df.reset_index()
    if columns is not None:
        df = df.reindex(columns=list(columns)).rename(columns=dict(columns))
    return df.dropna(axis=1, how="all") if drop_empty else df


def header(name: Any) -> str:
    """A column header as shown: a number as a context (1k, 32k, 128k; below 1,000 a plain integer), else text."""
    from specdiag.plots import format_tokens  # noqa: PLC0415 - plots imports matplotlib; only when a table has one

    if isinstance(name, bool) or not isinstance(name, numbers.Real):
        return str(name)
    value = float(name)
    if math.isfinite(value) and value == int(value):
        return format_tokens(value) if value >= 1000 else str(int(value))
    return f"{value:g}"


def is_empty(value: Any) -> bool:
    """None, NaN or pandas' missing value."""
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # lists and other containers
        return False


def column_decimals(values: Iterable[Any], digits: int = DIGITS) -> int | None:
    """Decimals that give ``digits`` significant digits at the median magnitude of the column's numbers;
    0 when they are all whole numbers; None when the column holds no number."""
    nums = [float(v) for v in values if isinstance(v, numbers.Real) and not isinstance(v, bool) and not is_empty(v)
            and math.isfinite(float(v))]
    if not nums:
        return None
    if all(v == int(v) for v in nums):
        return 0
    nonzero = sorted(abs(v) for v in nums if v)
    if not nonzero:
        return 0
    median = nonzero[len(nonzero) // 2]
    return max(0, min(MAX_DECIMALS, digits - 1 - math.floor(math.log10(median))))


def _whole(values: Iterable[Any]) -> bool:
    nums = [float(v) for v in values if isinstance(v, numbers.Real) and not isinstance(v, bool) and not is_empty(v)]
    return all(math.isfinite(v) and v == int(v) for v in nums)


def cell(value: Any, decimals: int | None, digits: int = DIGITS) -> str:
    """One cell as text: a dash when empty, numbers with ``decimals`` (None: ``digits`` significant) and
    thousands separators, booleans as yes/no, lists item by item (at most :data:`LIST_ITEMS`)."""
    if isinstance(value, (list, tuple)):
        items = [cell(v, decimals if decimals is not None else None, digits) for v in value[:LIST_ITEMS]]
        return ", ".join(items) + (f", ... ({len(value)} in all)" if len(value) > LIST_ITEMS else "")
    if is_empty(value):
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, numbers.Real):
        v = float(value)
        if not math.isfinite(v):
            return str(v)
        if decimals is None:
            decimals = column_decimals([v], digits) or 0
        return f"{v:,.{decimals}f}"
    return str(value)


def table(rows: Iterable[Mapping[str, Any]] | pd.DataFrame, columns: Mapping[Any, str] | None = None, *,
          formats: Mapping[Any, Format] | None = None, digits: int = DIGITS, decimals: int | None = None,
          drop_empty: bool = True, dash_means: str = DASH_MEANS, note: str = "") -> Styler:
    """The rows as a table fit to read (see the module's docstring): :func:`frame`, then each column rounded
    (``decimals`` fixed for every column of fractions, else ``digits`` significant at the column's median),
    ``formats`` per column key (a format string such as ``"{:.0%}"``, or a function of the value), numeric headers
    as contexts, no index, a dash for an empty cell and then ``dash_means`` in a note below; ``note``: more
    text for that note."""
    df = frame(rows, columns, drop_empty)
    labels = dict(columns) if columns is not None else {c: c for c in df.columns}
    unknown = [k for k in (formats or {}) if k not in labels]
    if unknown:
        raise KeyError(f"format given for {unknown[0]!r}, which is not one of the table's columns {list(labels)}")
    own = {labels[k]: f for k, f in (formats or {}).items()}
    shown = {c: header(c) for c in df.columns}
    if len(set(shown.values())) == len(shown):
        df = df.rename(columns=shown)
        own = {shown.get(k, k): f for k, f in own.items()}
    style = df.style.hide(axis="index")
    for col in df.columns:
        fmt = own.get(col)
        if fmt is None:
            if not pd.api.types.is_numeric_dtype(df[col]):  # text, or mixed values (a settings table): each number
                # rounded by itself; pandas 3 gives text its own dtype, so ask for numbers rather than for object
                dec = None
                if any(isinstance(v, str) for v in df[col]):
                    i = list(df.columns).index(col)
                    style = style.set_properties(subset=[col], **{"text-align": "left"}).set_table_styles(
                        [{"selector": f"th.col_heading.col{i}", "props": "text-align: left;"}], overwrite=False)
            else:
                dec = column_decimals(df[col], digits)
                if decimals is not None and dec is not None and not _whole(df[col]):
                    dec = decimals  # a column of fractions gets the fixed decimals; whole numbers stay whole
            style = style.format(lambda v, d=dec: cell(v, d, digits), subset=[col])
        elif isinstance(fmt, str):
            style = style.format(lambda v, f=fmt: DASH if is_empty(v) else f.format(v), subset=[col])
        else:
            style = style.format(lambda v, f=fmt: DASH if is_empty(v) else f(v), subset=[col])
    has_dash = any(is_empty(v) for col in df.columns for v in df[col] if not isinstance(v, (list, tuple)))
    caption = " ".join(p for p in ((f"{DASH} : {dash_means}." if has_dash else ""), note) if p)
    if caption:
        style = style.set_caption(caption).set_table_styles(
            [{"selector": "caption", "props": "caption-side: bottom; text-align: left; font-size: 85%; color: #666;"}],
            overwrite=False)
    return style


def styled(rows: Iterable[Mapping[str, Any]] | pd.DataFrame, columns: Mapping[str, str], precision: int = 3,
           formats: Mapping[str, str] | None = None, drop_empty: bool = True) -> Styler:
    """:func:`table` with ``precision`` decimals on every column of fractions (whole numbers stay whole), then
    ``formats`` (column key -> format string, e.g. ``"{:.0%}"``) on their columns."""
    return table(rows, columns, formats=formats, decimals=precision, drop_empty=drop_empty)


#: Items a key number's list or mapping shows before it is shortened (:func:`brief`).
LIST_ITEMS = 6


def brief(value: Any, items: int = LIST_ITEMS) -> str:
    """A key number as a reader wants it: 3 significant digits (thousands separated), lists and small mappings
    shortened; a deeper structure is summarized by its size."""
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "-"}[value]
    if isinstance(value, numbers.Real):
        v = float(value)
        if not math.isfinite(v):
            return str(v)
        if v == int(v) and abs(v) < 1e15:
            return f"{int(v):,}"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    if isinstance(value, str):
        return value if len(value) <= 120 else value[:117] + "..."
    if isinstance(value, (list, tuple)):
        if all(not isinstance(v, (list, tuple, Mapping)) for v in value):
            shown = ", ".join(brief(v) for v in value[:items])
            return f"[{shown}{', ...' if len(value) > items else ''}]" + (f" ({len(value)})" if len(value) > items else "")
        return f"{len(value)} entries"
    if isinstance(value, Mapping):
        if len(value) <= items and all(not isinstance(v, (list, tuple, Mapping)) for v in value.values()):
            return "{" + ", ".join(f"{k}: {brief(v)}" for k, v in value.items()) + "}"
        return f"{len(value)} entries"
    return str(value)
