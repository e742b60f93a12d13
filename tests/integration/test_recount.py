"""The reaper's recount (fleetq.recount_reservations): a runner whose row a reap could
not lock is owed a recount, and a later pass sets its reserved capacity and slot counts
to what its jobs hold. It recounts only runners owed one whose row is free now: a row
another transaction holds is skipped, never waited for, and stays owed; no other
runner's row or lanes are written (mutants recount-*)."""

from __future__ import annotations

from fleetq.core import leasing, producer
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import Driver
from fleetq.core.models import RunnerId
from tests import fleet
from tests.fleet import SHA


def _state(conn: SyncConnection, runner: RunnerId) -> tuple[int, int, int]:
    """Reserved memory and CPU, and the checks lane's used slots."""
    row = conn.execute(
        "SELECT r.reserved_memory_mb, r.reserved_cpu_millis, l.slots_used "
        "FROM fleetq.runners r JOIN fleetq.runner_lanes l ON l.runner_id = r.id "
        "WHERE r.id = $1 AND l.lane = 'checks'",
        [runner],
    ).fetchone()
    assert row is not None
    return (int(row[0]), int(row[1]), int(row[2]))


def _drift(conn: SyncConnection, runner: RunnerId, memory: int, slots: int) -> None:
    conn.execute(
        "UPDATE fleetq.runners SET reserved_memory_mb = $2 WHERE id = $1", [runner, memory]
    )
    conn.execute(
        "UPDATE fleetq.runner_lanes SET slots_used = $2 WHERE runner_id = $1 AND lane = 'checks'",
        [runner, slots],
    )


def _owed(conn: SyncConnection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT runner_id FROM fleetq.recount ORDER BY 1")]


def _recount(conn: SyncConnection) -> int | None:
    (n,) = conn.execute("SELECT fleetq.recount_reservations()").fetchone() or (None,)
    return None if n is None else int(n)


async def test_a_recount_sets_what_the_jobs_hold_and_skips_a_held_row(
    driver: Driver, sync_conn: SyncConnection, db_dsn: str
) -> None:
    fleet.operations(sync_conn)
    runners = []
    for name, node in (("r1", "node-a"), ("r2", "node-b"), ("r3", "node-c")):
        runner = await fleet.runner(driver, name, node=node)
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
        )
        assert len(await leasing.claim(driver, runner=runner, lane="checks", limit=1)) == 1
        runners.append(runner)
    one, held, other = runners
    truth = _state(sync_conn, one)
    assert truth == (256, 500, 1)
    # r1 and r2 are owed a recount, r2's row is held elsewhere; r3 is owed none (its
    # counts are made wrong here only to show they are not written)
    for runner, memory, slots in ((one, 9999, 3), (held, 7777, 2), (other, 5555, 4)):
        _drift(sync_conn, runner, memory, slots)
    sync_conn.execute("INSERT INTO fleetq.recount (runner_id) VALUES ($1), ($2)", [one, held])
    sync_conn.execute("SET lock_timeout = '5s'")  # a recount that waits fails, not hangs
    with connect(db_dsn) as holder:
        holder.execute("SELECT 1 FROM fleetq.runners WHERE id = $1 FOR UPDATE", [held])
        assert _recount(sync_conn) == 1
        assert _state(sync_conn, one) == truth
        assert _owed(sync_conn) == [held]
        holder.rollback()
    assert _state(sync_conn, held) == (7777, 500, 2)  # skipped, not waited for
    assert _state(sync_conn, other) == (5555, 500, 4)  # not owed: not written
    assert _recount(sync_conn) == 1  # its row free now
    assert (_state(sync_conn, held), _owed(sync_conn)) == (truth, [])
    assert _recount(sync_conn) == 0  # nothing owed
