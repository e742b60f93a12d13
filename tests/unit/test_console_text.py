"""Untrusted text is shown literally and cannot drive the terminal."""

from __future__ import annotations

import pytest
from rich.text import Text

from fleetq.console.text import duration, escape, lines, one_line, plain, sparkline
from fleetq.console.views.table import literal


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[31mred\x1b[0m", r"\x1b[31mred\x1b[0m"),  # SGR colour
        ("a\x1b[2J\x1b[Hb", r"a\x1b[2J\x1b[Hb"),  # clear screen, cursor home
        ("\x1b]0;title\x07x", r"\x1b]0;title\x07x"),  # OSC: set window title (BEL)
        ("\x1b]52;c;cHduZWQ=\x07", r"\x1b]52;c;cHduZWQ=\x07"),  # OSC 52: write the clipboard
        ("\x1b]8;;http://evil\x1b\\link", r"\x1b]8;;http://evil\x1b\link"),  # OSC 8 (ST)
        ("\x9b31mC1\x85", r"\x9b31mC1\x85"),  # 8-bit CSI, NEL
        ("bell\x07 back\x08 nul\x00 del\x7f", r"bell\x07 back\x08 nul\x00 del\x7f"),
        ("cr\rlf\ntab\t", r"cr\rlf\ntab\t"),  # one line: line breaks shown
        ("\u202egnp.exe\u2066\u200f", r"\u202egnp.exe\u2066\u200f"),  # bidi overrides
        ("a\u2028b\u2029c", r"a\u2028b\u2029c"),  # Unicode line/paragraph separators
        ("[/bold] [red]x[/red] é ✓ 日本", "[/bold] [red]x[/red] é ✓ 日本"),  # text is text
        (None, ""),
    ],
)
def test_escape_shows_every_control_character_as_text(raw: str | None, shown: str) -> None:
    assert escape(raw) == shown
    assert escape(shown) == shown  # idempotent: nothing left to escape


def test_escape_keeps_the_lines_of_multi_line_text() -> None:
    assert escape("a\tb\nc\r\n\x1b]0;t\x07", one_line=False) == "a\tb\nc\\r\n\\x1b]0;t\\x07"
    assert lines("one\r\ntwo\rstill two\n\x1b[2J\n") == ["one", r"two\rstill two", r"\x1b[2J"]
    assert lines("") == [] and lines(None) == []


def test_plain_never_interprets_markup() -> None:
    text = plain("[/bold] [bold red]boom[/]")
    assert text.plain == "[/bold] [bold red]boom[/]"
    assert text.spans == []


def test_one_line_shows_line_breaks_folds_spaces_and_cuts() -> None:
    assert one_line("a\n  b\tc", 10) == r"a\n b\tc"
    assert one_line("x" * 30, 10) == "x" * 9 + "…"


def test_duration_and_sparkline() -> None:
    assert [duration(s) for s in (0.25, 12.34, 245, 7800, 200000)] == [
        "250ms",
        "12.3s",
        "4m05s",
        "2h10m",
        "2d07h",
    ]
    assert duration(None) == "-" and duration(-3) == "-3.0s"
    assert sparkline([0, 1, 2, 4]) == "▁▂▄█"
    assert sparkline([0, 0]) == "▁▁"


def test_a_table_cell_given_as_a_string_is_never_markup() -> None:
    cell = literal("[bold red]x[/]\x1b[2J")
    assert isinstance(cell, Text) and cell.plain == "[bold red]x[/]\\x1b[2J" and not cell.spans
    styled = Text("kept", style="green")
    assert literal(styled) is styled
