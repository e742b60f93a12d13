"""The only place that looks SQL up by name.

Each query is written once, in a named block of a per-concern file in `core/sql/`:

    -- name: upsert_lane
    -- Why the query exists, in a line or two.
    -- $1 name, $2 description
    INSERT INTO ...;

Blocks use `$1…$n` placeholders so asyncpg and psycopg (through `RawCursor`) run the same
text. Nothing builds SQL from strings at run time.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import LiteralString

from fleetq.core.errors import FleetqError

_BLOCK = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


@cache
def _all() -> dict[str, str]:
    blocks: dict[str, str] = {}
    for entry in sorted(resources.files("fleetq.core.sql").iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text(encoding="utf-8")
        parts = _BLOCK.split(text)
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in blocks:
                raise FleetqError(f"SQL block {name!r} is defined twice ({entry.name})")
            blocks[name] = body.strip()
    return blocks


def sql(name: str) -> LiteralString:
    """The text of the named block. Blocks come from files shipped with the code, never
    from input, which is what makes them safe to treat as literal SQL."""
    try:
        return _all()[name]  # LiteralString: shipped with the code, never from input
    except KeyError:
        raise FleetqError(f"no SQL block named {name!r}") from None


def names() -> list[str]:
    """Every block name (tests check each one has an integration test)."""
    return sorted(_all())
