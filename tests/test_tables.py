"""The one table helper: columns picked and labelled in order, empty ones dropped, formats per column."""

from __future__ import annotations

import pytest

from specdiag import tables

ROWS = [{"context_tokens": 1400, "step_ms": 8.4123, "share": 0.25, "commit_length": None, "extra": 1},
        {"context_tokens": 185000, "step_ms": 1430.0, "share": 0.5, "commit_length": None, "extra": 2}]
COLUMNS = {"context_tokens": "context (tokens)", "step_ms": "ms per step", "share": "share",
           "commit_length": "commit length (tok/step)", "missing": "never there"}


def test_frame_picks_labels_and_drops_empty_columns() -> None:
    df = tables.frame(ROWS, COLUMNS)
    assert list(df.columns) == ["context (tokens)", "ms per step", "share"]
    assert list(tables.frame(ROWS, COLUMNS, drop_empty=False).columns) == list(COLUMNS.values())


def test_styled_keeps_the_precision_beside_a_column_format() -> None:
    html = tables.styled(ROWS, COLUMNS, precision=2, formats={"share": "{:.0%}"}).to_html()
    assert "8.41" in html and "1,430.00" in html and "185,000" in html  # precision and thousands everywhere
    assert "25%" in html and "50%" in html                               # the column's own format
    assert "never there" not in html
    with pytest.raises(KeyError, match="not one of the table's columns"):
        tables.styled(ROWS, COLUMNS, formats={"nope": "{:.1f}"})


def _cells(style) -> tuple[list[str], list[list[str]], str]:
    """(headers, rows of cell texts, caption) as the page shows them."""
    import re

    html = style.to_html()
    heads = [re.sub(r"<[^>]+>", "", h).strip() for h in re.findall(r"<th[^>]*>(.*?)</th>", html, re.S)]
    body = html.split("<tbody>")[1]
    rows = [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
            for r in re.findall(r"<tr>(.*?)</tr>", body, re.S)]
    caption = re.findall(r"<caption>(.*?)</caption>", html, re.S)
    return heads, rows, caption[0] if caption else ""


def test_table_shows_no_index_context_headers_dashes_with_a_note_and_rounds_per_column() -> None:
    """06's raw pivots: index column, '65536.0' headers, NaN cells, 15-digit floats. The formatter's page has none."""
    import numpy as np
    import pandas as pd

    raw = pd.DataFrame({"heads": [8, 8, 16, 16], "draft_tokens": [1, 1, 8, 8],
                        "context_tokens": [65536.0, 131072.0, 131072.0, 185000.0],
                        "speedup": [12.345678901234567, 5.0, np.nan, 3.0000001],
                        "ms": [0.012345678, 1.5, 2.5, 1234.56789]})
    pivot = raw.pivot_table(index=["heads", "draft_tokens"], columns="context_tokens", values="speedup")
    heads, rows, caption = _cells(tables.table(pivot))
    assert heads == ["heads", "draft_tokens", "64k", "128k", "185k"]  # the index as columns, contexts as 64k...
    assert rows[0][:2] == ["8", "1"] and "12.3" in rows[0] and "-" in rows[0]
    assert caption.startswith("- : ") and "not measured" in caption
    _, rows, _ = _cells(tables.table(raw, {"context_tokens": "context (tokens)", "ms": "ms"}))
    assert [r[0] for r in rows] == ["65,536", "131,072", "131,072", "185,000"]  # whole numbers stay whole
    assert [r[1] for r in rows] == ["0.01", "1.50", "2.50", "1,234.57"]  # 3 significant digits at the column's median
    heads, rows, caption = _cells(tables.table([{"a": 1, "b": "x"}], {"a": "a (tokens)", "b": "b"}))
    assert heads == ["a (tokens)", "b"] and rows == [["1", "x"]] and caption == ""  # no dash, no note
    assert tables.header(512) == "512" and tables.header(131072.0) == "128k" and tables.header(1.5) == "1.5"
    assert tables.cell([0.123456, 2.0, None], 2) == "0.12, 2.00, -" and tables.cell(True, None) == "yes"
    assert tables.column_decimals([0.000123, 0.0004]) == 6 and tables.column_decimals(["x"]) is None


def test_text_columns_align_left_and_mixed_columns_round_cell_by_cell() -> None:
    rows = [{"setting": "context length", "value": 16384}, {"setting": "mem fraction", "value": 0.8812345},
            {"setting": "attention backend", "value": "triton"}]
    style = tables.table(rows)
    html = style.to_html()
    _, cells, _ = _cells(style)
    assert [c[1] for c in cells] == ["16,384", "0.881", "triton"]
    css = html.split("</style>")[0]  # every rule here aligns left: cells and headers of both columns (text in both)
    assert "text-align: left" in css and "right" not in css
    assert all(s in css for s in ("_row0_col0", "_row2_col1", "th.col_heading.col0", "th.col_heading.col1"))
