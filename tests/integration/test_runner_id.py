"""One process per runner id (fleetq.take_runner_id): a session takes the id when no live
session holds it, or when it holds it itself; a live holder (its row, or the advisory
lock an older runner held) is named, never displaced; taking one id touches no other
id's row (mutants take-runner-id-*)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

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


def _hold(conn: SyncConnection, runner: str, holder: str, seconds: int = 30) -> tuple[bool, str]:
    row = conn.execute(
        "SELECT taken, holder FROM fleetq.hold_runner_id($1, $2, $3)", [runner, holder, seconds]
    ).fetchone()
    assert row is not None
    conn.commit()
    return (bool(row[0]), str(row[1]))


def test_a_runner_served_through_the_api_holds_its_id_for_a_while(db_dsn: str) -> None:
    """Issue 46: a runner through the API has no session to hold its id by; it holds it
    for a while and renews. A live session's lock and another holder's running hold are
    named, never displaced; the same holder renews; a hold run out is free."""
    with connect(db_dsn) as a, connect(db_dsn) as b, connect(db_dsn, autocommit=True) as look:
        assert _hold(a, "node-a/h1", "api here") == (True, "api here")
        (left,) = look.execute(
            "SELECT extract(epoch FROM holder_until - clock_timestamp()) "
            "FROM fleetq.coordination WHERE name = 'runner:node-a/h1'"
        ).fetchone() or (None,)
        assert left is not None and 25 < left <= 30, left  # held for the 30 s asked
        refused = b.execute(
            "SELECT taken, holder, left_s FROM fleetq.hold_runner_id('node-a/h1', 'api x', 30)"
        ).fetchone()
        b.commit()
        assert refused is not None and refused[:2] == (False, "api here")
        assert 25 < refused[2] <= 30, refused  # how long the holder's hold has left
        assert not stamps.future_stamps(db_dsn)  # taken_at, at once
        assert _hold(b, "node-a/h1", "api elsewhere") == (False, "api here")
        assert _hold(b, "node-a/h1", "api here") == (True, "api here")  # its renewal
        row = b.execute("SELECT taken, pid FROM fleetq.take_runner_id('node-a/h1')").fetchone()
        b.commit()
        assert row == (False, None)  # a direct runner is refused too
        assert _hold(a, "node-b/h2", "api x") == (True, "api x")  # another id: its own row
        look.execute(
            "UPDATE fleetq.coordination SET holder_until = clock_timestamp() "
            "WHERE name = 'runner:node-a/h1'"
        )
        assert _hold(b, "node-a/h1", "api elsewhere") == (True, "api elsewhere")  # ran out
        (other,) = look.execute(
            "SELECT holder_app FROM fleetq.coordination WHERE name = 'runner:node-b/h2'"
        ).fetchone() or (None,)
        assert other == "api x"  # one id's hold wrote no other id's row
        look.execute(
            "UPDATE fleetq.coordination SET holder_until = clock_timestamp() "
            "WHERE name = 'runner:node-a/h1'"
        )
        pb = _pid(b)
        assert _take(b, "node-a/h1") == (True, pb)
        assert _hold(a, "node-a/h1", "api here") == (False, "fleetq")  # a live session's
        for seconds in (0, 301):
            with pytest.raises(psycopg.Error, match="5 to 300 seconds"):
                _hold(a, "node-c/h3", "api", seconds)
            a.rollback()
        for holder in ("", "x" * 201):
            with pytest.raises(psycopg.Error, match="1 to 200 characters"):
                _hold(a, "node-c/h3", holder)
            a.rollback()
