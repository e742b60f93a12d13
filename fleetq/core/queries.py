"""The only place that looks SQL up by name.

Each query is written once, in a named block of a per-concern file in `core/sql/`:

    -- name: upsert_lane
    -- Why the query exists, in a line or two.
    -- $1 name, $2 description
    INSERT INTO ...;

Blocks use `$1…$n` placeholders so asyncpg and psycopg (through `RawCursor`) run the same
text. Nothing builds SQL from strings at run time.

`core/sql/` holds fleetq's own queries, each prepared against fleetq's schema by the tests.
A package whose queries read other schemas (the benchmark reads its peers' tables) keeps
them in a folder of its own and looks them up through a `Library` of that folder, so
this module stays the only place that looks a name up.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import LiteralString

from fleetq.core.errors import FleetqError

_BLOCK = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


@cache
def _load(package: str) -> dict[str, str]:
    blocks: dict[str, str] = {}
    for entry in sorted(resources.files(package).iterdir(), key=lambda e: e.name):
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
    return CORE.sql(name)


def names() -> list[str]:
    """Every block name (tests check each one has an integration test)."""
    return CORE.names()


def name_of(text: str) -> str | None:
    """The name of fleetq's block whose text is `text` (None: not one of them): how a
    runner served through the API names the statement it would have run."""
    return _names_by_text().get(text)


@cache
def _names_by_text() -> dict[str, str]:
    return {text: name for name, text in _load(CORE.package).items()}


class Library:
    """The named blocks of one package's `.sql` files (fleetq's own: `CORE`)."""

    def __init__(self, package: str) -> None:
        self.package = package

    def sql(self, name: str) -> LiteralString:
        """The text of the named block (see the module's `sql`)."""
        try:
            return _load(self.package)[name]  # LiteralString: shipped, never from input
        except KeyError:
            raise FleetqError(f"no SQL block named {name!r}") from None

    def names(self) -> list[str]:
        """Every block name of this package."""
        return sorted(_load(self.package))


CORE = Library("fleetq.core.sql")
