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
