"""Printing for the CLI: aligned tables for people, `--json` for machines, and the one
boundary every byte the CLI writes crosses on its way to a terminal.

Every string from the database is untrusted (see `fleetq.core.text`). Two rules keep it
harmless, both through `escape`: `terminal()` wraps stdout and stderr for the whole
command, so no control character but newline and tab is ever written raw, whatever
printed it; and a value shown on a line of its own making (a table cell, a name in a
sentence) is escaped one-line (`table`, `escape`), so a newline in it cannot start a
line that reads like fleetq's.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO, cast

from fleetq.core.text import escape

if TYPE_CHECKING:  # not imported to run: every command starts through here (cli.entry)
    from pydantic import BaseModel


def emit_json(value: BaseModel | Sequence[BaseModel] | dict[str, Any]) -> None:
    """One JSON document on stdout (ASCII only: every control character, DEL and any
    other non-ASCII character inside a string is a `\\uNNNN` escape)."""
    if isinstance(value, dict):
        data: Any = value
    elif isinstance(value, Sequence):
        data = [item.model_dump(mode="json") for item in value]
    else:
        data = value.model_dump(mode="json")
    json.dump(data, sys.stdout, indent=2, default=str, ensure_ascii=True)
    sys.stdout.write("\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned table (no colour: it is read in logs and pipes too). Cells are
    untrusted (names, reasons): each is escaped one-line, so a newline in one cannot
    start a row of its own."""
    cells = [
        [str(h) for h in headers],
        *[["" if c is None else escape(c) for c in r] for r in rows],
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


class _Escaping:
    """A text stream that writes what it is given through `escape(one_line=False)`
    (escaping is per character, so a write cut anywhere is escaped the same); anything
    else (flush, isatty, encoding, fileno) is the wrapped stream's."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(escape(text, one_line=False))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextmanager
def terminal() -> Iterator[None]:
    """While the block runs, stdout and stderr write nothing a terminal acts on."""
    out, err = sys.stdout, sys.stderr
    sys.stdout = cast(TextIO, _Escaping(out))
    sys.stderr = cast(TextIO, _Escaping(err))
    try:
        yield
    finally:
        # a stream the command replaced on its own (a closed pipe's, with /dev/null) stays
        if isinstance(sys.stdout, _Escaping):
            sys.stdout = out
        if isinstance(sys.stderr, _Escaping):
            sys.stderr = err
