"""What a reaper pass takes and what it leaves: it leads only when no other pass holds
the reaper's row (it skips, never waits); it requeues an expired lease, but not one
renewed while its row was held (a busy renewal), nor one whose row another transaction
holds (skipped, never waited for); it locks no runner but the expired leases' owners,
and owes a recount only to an owner whose row it could not lock (mutants reap-*). Its
other duties (aging, retries that fell due) skip held rows the same way."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import Driver
from tests import factories, fleet


def _states(conn: SyncConnection, jobs: list[int]) -> list[str]:
    rows = conn.execute(
        "SELECT state FROM fleetq.jobs WHERE id = ANY ($1) ORDER BY id", [jobs]
    ).fetchall()
    return [r[0] for r in rows]


def _reap(conn: SyncConnection) -> tuple[int, int, bool]:
    row = conn.execute("SELECT * FROM fleetq.reap(1000, NULL)").fetchone()
    assert row is not None
    return (int(row[0]), int(row[1]), bool(row[2]))


async def test_a_pass_takes_only_the_expired_leases_it_may(
    driver: Driver, sync_conn: SyncConnection, db_dsn: str
) -> None:
    fleet.operations(sync_conn)
    one = await fleet.runner(driver, "r1")
    other = await fleet.runner(driver, "r2", node="node-b")
    busy, expired, held = (c.job_id for c in await fleet.running(driver, one, 3))
    (alive,) = (c.job_id for c in await fleet.running(driver, other, 1))
    sync_conn.execute(
        "UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() - interval '1 second' "
        "WHERE id = ANY ($1)",
        [[busy, expired, held]],
    )
    sync_conn.execute(
        "INSERT INTO fleetq.busy_renewals (job_id, lease_version, lease_expires_at) "
        "VALUES ($1, 1, clock_timestamp() + interval '1 minute')",
        [busy],
    )
    with connect(db_dsn) as holder, connect(db_dsn) as reaper:
        holder.execute("SELECT 1 FROM fleetq.jobs WHERE id = $1 FOR NO KEY UPDATE", [held])
        reaper.execute("SET lock_timeout = '5s'")  # a pass that waits fails, not hangs
        assert _reap(reaper) == (1, 0, True)
        # the pass, not yet committed, holds no other runner's row
        with connect(db_dsn) as claim:
            claim.execute("SELECT 1 FROM fleetq.runners WHERE id = $1 FOR UPDATE NOWAIT", [other])
            claim.rollback()
        reaper.commit()
        holder.rollback()
    assert _states(sync_conn, [busy, expired, held, alive]) == [
        "running",
        "queued",
        "running",
        "running",
    ]
    # r1's row was free: its capacity was given back at once, no recount owed
    assert sync_conn.execute("SELECT count(*) FROM fleetq.recount").fetchone() == (0,)


async def test_a_second_pass_skips_while_the_leader_holds_the_row(
    driver: Driver, sync_conn: SyncConnection, db_dsn: str
) -> None:
    fleet.operations(sync_conn)
    one = await fleet.runner(driver, "r1")
    (job,) = (c.job_id for c in await fleet.running(driver, one, 1))
    assert _reap(sync_conn)[2]  # a pass that led (and dated the reaper's row)
    sync_conn.execute(
        "UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() - interval '1 second' "
        "WHERE id = $1",
        [job],
    )
    with connect(db_dsn) as leader:
        leader.execute("SELECT 1 FROM fleetq.coordination WHERE name = 'reaper' FOR UPDATE")
        with connect(db_dsn) as second:
            second.execute("SET lock_timeout = '5s'")
            try:
                assert _reap(second) == (0, 0, False)
            except psycopg.errors.LockNotAvailable:
                pytest.fail("the second pass waited for the leader's row")
            second.rollback()
        leader.rollback()
    assert _states(sync_conn, [job]) == ["running"]


def _class(conn: SyncConnection, jobs: list[int]) -> list[int]:
    rows = conn.execute(
        "SELECT priority_class FROM fleetq.jobs WHERE id = ANY ($1) ORDER BY id", [jobs]
    ).fetchall()
    return [int(r[0]) for r in rows]


def test_a_pass_promotes_and_queues_what_is_due_and_skips_held_rows(
    sync_conn: SyncConnection, db_dsn: str
) -> None:
    """Aging promotes a job queued longer than the setting, by the database's clock, and
    a retry that fell due is queued; a row another transaction holds is skipped, never
    waited for (mutants promote-waiting-*, queue-due-retries-*)."""
    fleet.operations(sync_conn)
    sync_conn.execute(
        "UPDATE fleetq.settings SET value = '60' WHERE name = 'aging_promote_after_seconds'"
    )
    old, held, young = (
        factories.job(sync_conn, op=("tools", "lint"), created_at=at)
        for at in (
            datetime.now(UTC) - timedelta(seconds=90),
            datetime.now(UTC) - timedelta(seconds=90),
            datetime.now(UTC) - timedelta(seconds=10),
        )
    )
    due, due_held = (
        factories.job(
            sync_conn,
            op=("tools", "lint"),
            state="waiting",
            attempts=1,
            retry_at=datetime.now(UTC) - timedelta(seconds=1),
        )
        for _ in range(2)
    )
    with connect(db_dsn) as holder, connect(db_dsn) as reaper:
        holder.execute(
            "SELECT 1 FROM fleetq.jobs WHERE id = ANY ($1) FOR NO KEY UPDATE", [[held, due_held]]
        )
        reaper.execute("SET lock_timeout = '5s'")  # a pass that waits fails, not hangs
        assert _reap(reaper)[2]
        reaper.commit()
        holder.rollback()
    assert _class(sync_conn, [old, held, young]) == [1, 2, 2]
    assert _states(sync_conn, [due, due_held]) == ["queued", "waiting"]
