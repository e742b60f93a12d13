"""Printing for the CLI: aligned tables for people, `--json` for machines."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from fleetq.core.text import escape


def emit_json(value: BaseModel | Sequence[BaseModel] | dict[str, Any]) -> None:
    """One JSON document on stdout."""
    if isinstance(value, BaseModel):
        data: Any = value.model_dump(mode="json")
    elif isinstance(value, dict):
        data = value
    else:
        data = [item.model_dump(mode="json") for item in value]
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned table (no colour: it is read in logs and pipes too). Cells are
    untrusted (names, reasons): control characters are shown escaped, never raw."""
    cells = [
        [str(h) for h in headers],
        *[["" if c is None else escape(c) for c in r] for r in rows],
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)
