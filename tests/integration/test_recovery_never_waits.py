"""Recovery never waits on a runner cut off mid-transaction (migration 0010). A session
left idle in transaction by a partitioned runner holds that runner's row; the reaper
used to wait on it (holding other runners' rows meanwhile, so their heartbeats waited
too and healthy runners fenced their own jobs), and no expired lease was recovered until
the stuck session died. Both tests are red on migration 0009's reap and heartbeat."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetq.core import leasing, producer
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import Driver
from fleetq.core.models import JobId, RunnerId, WriteStatus
from tests import fleet
from tests.fleet import SHA


@pytest.fixture
def held_row(db_dsn: str) -> Iterator[SyncConnection]:
    """A session that will hold a runner's row, as a partitioned runner's does."""
    with connect(db_dsn) as conn:
        yield conn
        conn.rollback()


async def _claimed(driver: Driver, runner: RunnerId) -> JobId:
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="a")
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    return claim.job_id


def _reserved(conn: SyncConnection, runner: str) -> tuple[int, int]:
    row = conn.execute(
        "SELECT r.reserved_memory_mb, l.slots_used FROM fleetq.runners r "
        "JOIN fleetq.runner_lanes l ON l.runner_id = r.id AND l.lane = 'checks' "
        "WHERE r.id = $1",
        [runner],
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def test_the_reaper_requeues_a_cut_off_runners_jobs_without_waiting_for_its_row(
    db_dsn: str, sync_conn: SyncConnection, driver: Driver, held_row: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    a = await fleet.runner(driver, "a", node="node-a")
    b = await fleet.runner(driver, "b", node="node-b")
    job_a, job_b = await _claimed(driver, a), await _claimed(driver, b)
    sync_conn.execute(
        "UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() - interval '1 second'"
    )
    held_row.execute("SELECT 1 FROM fleetq.runners WHERE id = $1 FOR UPDATE", [b])

    with connect(db_dsn, autocommit=True) as reaper:
        reaper.execute("SET lock_timeout = '1s'")  # waiting at all would end in an error
        (requeued, failed, leader) = reaper.execute(
            "SELECT requeued, failed, leader FROM fleetq.reap()"
        ).fetchone()  # type: ignore[misc]
        assert (requeued, failed, leader) == (2, 0, True)
        states = dict(
            reaper.execute(
                "SELECT id, state FROM fleetq.jobs WHERE id = ANY ($1)", [[job_a, job_b]]
            )
        )
        assert states == {job_a: "queued", job_b: "queued"}
        assert _reserved(reaper, a) == (0, 0)  # given back at once
        assert _reserved(reaper, b) == (256, 1)  # owed: its row was held
        held_row.rollback()  # the stuck session dies
        with fleet.wakeups(db_dsn) as woken:
            reaper.execute("SELECT * FROM fleetq.reap()").fetchall()
        assert _reserved(reaper, b) == (0, 0)  # recounted from its jobs
        # the room the recount gives back was announced by nothing else: wake its lanes,
        # or a job that waited for it waits for a runner's poll (up to --poll-max)
        assert "checks" in woken
        assert reaper.execute("SELECT count(*) FROM fleetq.recount").fetchone() == (0,)


async def test_a_heartbeat_renews_its_leases_while_another_session_holds_its_row(
    db_dsn: str, sync_conn: SyncConnection, driver: Driver, held_row: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver)
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="a")
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    held_row.execute("SELECT 1 FROM fleetq.runners WHERE id = $1 FOR UPDATE", [runner])
    with connect(db_dsn, autocommit=True) as beat:
        beat.execute("SET lock_timeout = '1s'")
        rows = beat.execute(
            "SELECT job_id, status FROM fleetq.heartbeat($1, $2, $3)",
            [runner, [claim.job_id], [claim.lease_version]],
        ).fetchall()
    assert rows == [(claim.job_id, WriteStatus.OK.value)]


COMPLETE = (
    "SELECT * FROM fleetq.complete($1, ARRAY[$2::bigint], ARRAY[$3::bigint], "
    "ARRAY['succeeded'], ARRAY[0], ARRAY[NULL::text], ARRAY[''], ARRAY[NULL::integer], "
    "ARRAY[NULL::integer], ARRAY[0])"
)


async def test_an_outcome_never_waits_for_another_outcome_of_the_same_check(
    db_dsn: str, sync_conn: SyncConnection, driver: Driver, held_row: SyncConnection
) -> None:
    """Two jobs check the same (project, commit, operation). The first one's outcome is
    written in a transaction that does not end (its runner was stopped inside a handler's
    `transaction(finish=True)`); the second one's outcome is recorded at once, and the
    latest verdict is the newest job's. Red on migration 0010: one results row per check,
    and the second outcome waited on it."""
    fleet.operations(sync_conn)
    a = await fleet.runner(driver, "a", node="node-a")
    b = await fleet.runner(driver, "b", node="node-b")
    first, second = await _claimed(driver, a), await _claimed(driver, b)
    held_row.execute(COMPLETE, [a, first, 1])  # uncommitted
    with connect(db_dsn, autocommit=True) as other:
        other.execute("SET lock_timeout = '1s'")
        assert other.execute(COMPLETE, [b, second, 1]).fetchall() == [(second, "ok")]
        held_row.commit()
        row = other.execute(
            "SELECT job_id, verdict FROM fleetq.results WHERE project = 'tools' "
            "AND commit_sha = $1 AND operation = 'lint'",
            [SHA],
        ).fetchone()
    assert row == (max(first, second), "passed")
