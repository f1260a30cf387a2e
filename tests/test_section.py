"""specdiag.section.Section: what a notebook section shows, in order, and what it computed."""

from __future__ import annotations

from specdiag.section import Section


def test_section_keeps_parts_in_order_and_its_data(capsys) -> None:
    s = Section(data={"n": 3}).text("first line").table([{"a": 1}], {"a": "a (x)"}).markdown("**b**")
    assert [k for k, _ in s.parts] == ["text", "table", "markdown"]
    assert s.lines == ["first line", "**b**"] and s["n"] == 3
    s.show()
    assert "first line" in capsys.readouterr().out
