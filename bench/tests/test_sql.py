"""The benchmarks' blocks on fleetq's own schema (`bench.sql`, `bench_scale.sql`): each
block the code names exists, and each one prepares against the migrated schema, as
tests/unit/test_queries.py holds fleetq's own blocks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import fleetq_bench
from fleetq.core.db import SyncConnection
from fleetq_bench.sql import SQL

ON_FLEETQ = [name for name in SQL.names() if name.startswith("bench_")]


def test_every_block_the_code_names_exists() -> None:
    named = {
        m.group(1)
        for path in Path(fleetq_bench.__file__).parent.rglob("*.py")
        for m in re.finditer(r'SQL\.sql\(\s*"([a-z0-9_]+)"', path.read_text())
    }
    assert named and not named - set(SQL.names())


@pytest.mark.parametrize("name", ON_FLEETQ)
def test_block_prepares_against_the_schema(tx: SyncConnection, name: str) -> None:
    """PREPARE parses and plans the statement without running it. VACUUM can neither be
    prepared nor run in a transaction: test_history.py runs its one such block."""
    text = SQL.sql(name)
    code = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
    if code[0].upper().startswith("VACUUM"):
        assert name == "bench_scale_vacuum", name
        return
    tx.execute(f"PREPARE check_block AS {text.rstrip(';')}".encode())
    tx.execute("DEALLOCATE check_block")
