"""The CLI's output boundary: nothing it writes reaches a terminal raw."""

from __future__ import annotations

import io
import json
import sys

import pytest
from pydantic import BaseModel

from fleetq.cli.output import emit_json, table, terminal

HOSTILE = "a\x1b]0;t\x07\r\nb\x9b2J\u202ec\x7f\td"


def test_terminal_escapes_stdout_and_stderr_but_keeps_lines_and_tabs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with terminal():
        print(HOSTILE)
        print(HOSTILE, file=sys.stderr, flush=True)
        sys.stdout.write("\x1b")  # written in pieces: each piece escaped the same
        sys.stdout.write("[2J\n")
    out, err = capsys.readouterr()
    shown = "a\\x1b]0;t\\x07\\r\nb\\x9b2J\\u202ec\\x7f\td\n"
    assert out == shown + "\\x1b[2J\n" and err == shown


def test_terminal_gives_the_streams_back_and_keeps_one_the_command_replaced() -> None:
    out, err = sys.stdout, sys.stderr
    with terminal():
        assert sys.stdout is not out and sys.stdout.isatty() == out.isatty()
    assert (sys.stdout, sys.stderr) == (out, err)
    elsewhere = io.StringIO()
    try:
        with terminal():
            sys.stdout = elsewhere  # as main does for a closed pipe
        assert sys.stdout is elsewhere and sys.stderr is err
    finally:
        sys.stdout = out
    with pytest.raises(SystemExit), terminal():
        raise SystemExit(2)  # argparse's exits too
    assert (sys.stdout, sys.stderr) == (out, err)


def test_a_table_cell_cannot_start_a_row() -> None:
    lines = table(["name", "reason"], [["x", HOSTILE], [None, 1]]).split("\n")
    assert len(lines) == 3
    assert lines[1] == "x     a\\x1b]0;t\\x07\\r\\nb\\x9b2J\\u202ec\\x7f\\td"


class _Row(BaseModel):
    reason: str


def test_json_escapes_every_control_character(capsys: pytest.CaptureFixture[str]) -> None:
    emit_json([_Row(reason=HOSTILE)])
    out = capsys.readouterr().out
    assert out.isascii() and not any((c < " " and c != "\n") or c == "\x7f" for c in out)
    assert json.loads(out) == [{"reason": HOSTILE}]
