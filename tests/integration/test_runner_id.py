"""One process per runner id (fleetq.take_runner_id): a session takes the id when no live
session holds it, or when it holds it itself; a live holder (its row, or the advisory
lock an older runner held) is named, never displaced; taking one id touches no other
id's row (mutants take-runner-id-*)."""

from __future__ import annotations

from typing import Any

from fleetq.core.db import SyncConnection, connect
from tests import stamps

KEY = 6712433  # 0x666C71, "flq": the advisory key's class an older runner held


def _take(conn: SyncConnection, runner: str) -> tuple[bool, int]:
    row = conn.execute("SELECT taken, pid FROM fleetq.take_runner_id($1)", [runner]).fetchone()
    assert row is not None
    conn.commit()
    return (bool(row[0]), int(row[1]))


def _pid(conn: SyncConnection) -> int:
    (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone() or (0,)
    conn.commit()
    return int(pid)


def _holders(conn: SyncConnection) -> dict[str, Any]:
    rows = conn.execute(
        "SELECT name, holder_pid FROM fleetq.coordination WHERE name LIKE 'runner:%'"
    ).fetchall()
    return {str(name): pid for name, pid in rows}


def test_a_runner_id_is_taken_once_and_a_live_holder_is_named(db_dsn: str) -> None:
    with connect(db_dsn) as a, connect(db_dsn) as b, connect(db_dsn, autocommit=True) as look:
        pa, pb = _pid(a), _pid(b)
        assert _take(a, "node-a/r1") == (True, pa)
        assert not stamps.future_stamps(db_dsn)  # taken_at, at once
        assert _take(b, "node-a/r1") == (False, pa)  # a live holder: named
        assert _take(a, "node-a/r1") == (True, pa)  # its own: taken again
        assert _take(b, "node-b/r2") == (True, pb)  # another id: its own row only
        assert _holders(look) == {"runner:node-a/r1": pa, "runner:node-b/r2": pb}
    with connect(db_dsn) as c:
        # both holders gone: the id is free
        assert _take(c, "node-a/r1") == (True, _pid(c))


def test_an_older_runner_holding_the_advisory_lock_is_named(db_dsn: str) -> None:
    with connect(db_dsn, autocommit=True) as old, connect(db_dsn) as new:
        old.execute("SELECT pg_advisory_lock($1, hashtext('node-a/r3'))", [KEY])
        (pid,) = old.execute("SELECT pg_backend_pid()").fetchone() or (0,)
        assert _take(new, "node-a/r3") == (False, pid)
        old.execute("SELECT pg_advisory_unlock($1, hashtext('node-a/r3'))", [KEY])
        assert _take(new, "node-a/r3") == (True, _pid(new))
