"""SQL blocks: named once, loaded from the package, each one parseable by PostgreSQL."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleetq.core import queries
from fleetq.core.db import SyncConnection
from fleetq.core.errors import FleetqError


def test_every_block_has_a_unique_name_and_text() -> None:
    names = queries.names()
    assert names == sorted(set(names))
    assert all(queries.sql(n).strip() for n in names)


def test_every_block_the_code_names_exists() -> None:
    """A block removed while code still names it fails at run time only, in whatever
    rarely run path names it (a merge dropped two the scale benchmark reads)."""
    named = {
        m.group(1)
        for path in Path(queries.__file__).parents[1].rglob("*.py")
        for m in re.finditer(r'queries\.sql\("([a-z0-9_]+)"\)', path.read_text())
    }
    assert named and not named - set(queries.names())


def test_unknown_block_is_an_error() -> None:
    with pytest.raises(FleetqError, match="no SQL block named 'nope'"):
        queries.sql("nope")


@pytest.mark.parametrize("name", queries.names())
def test_block_prepares_against_the_schema(tx: SyncConnection, name: str) -> None:
    """PREPARE parses and plans the statement without running it: a typo in a column
    or a placeholder fails here, not in production. DDL cannot be prepared, nor can DO,
    SET or LOCK: it runs, inside the transaction the fixture rolls back (a DROP too: the
    rollback restores it)."""
    text = queries.sql(name)
    code = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
    if code[0].upper().startswith(("CREATE", "DROP", "DO ", "SET ", "LOCK ")):
        tx.execute(text.encode())
        return
    tx.execute(f"PREPARE check_block AS {text.rstrip(';')}".encode())
    tx.execute("DEALLOCATE check_block")
