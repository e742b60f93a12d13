"""Untrusted text is shown literally and cannot drive the terminal."""

from __future__ import annotations

import pytest

from fleetq.console.text import clean, duration, one_line, plain, sparkline


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[31mred\x1b[0m", "red"),  # SGR colour
        ("a\x1b[2J\x1b[Hb", "ab"),  # clear screen, cursor home
        ("\x1b]0;title\x07x", "x"),  # OSC: set window title (BEL)
        ("\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\", "link"),  # OSC 8 hyperlink (ST)
        ("\x9b31mC1\x9b0m", "C1"),  # 8-bit CSI
        ("bell\x07 back\x08 nul\x00", "bell back nul"),
        ("tab\tand\nnewline", "tab\tand\nnewline"),  # layout characters stay
        ("[/bold] [red]x[/red]", "[/bold] [red]x[/red]"),  # markup is just text
    ],
)
def test_clean_strips_control_sequences(raw: str, shown: str) -> None:
    assert clean(raw) == shown


def test_plain_never_interprets_markup() -> None:
    text = plain("[/bold] [bold red]boom[/]")
    assert text.plain == "[/bold] [bold red]boom[/]"
    assert text.spans == []


def test_one_line_folds_and_cuts() -> None:
    assert one_line("a\n  b\tc", 10) == "a b c"
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
