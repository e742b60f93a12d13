"""Aging (settings.aging_promote_after_seconds): off by default; when set, a job queued
that long is promoted one class by the reaper's leader, and again after each further
such wait, up to class 0, so it overtakes younger jobs of the class it reached."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from fleetq.core import leasing, producer, readers
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver
from tests import fleet
from tests.fleet import SHA

AFTER_S = 60


@pytest.fixture(autouse=True)
def _fleet(sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)


def _aging_on(conn: SyncConnection) -> None:
    conn.execute(
        "UPDATE fleetq.settings SET value = $1 WHERE name = 'aging_promote_after_seconds'",
        [str(AFTER_S)],
    )


def _reap_at(conn: SyncConnection, at: datetime) -> None:
    conn.execute("SELECT * FROM fleetq.reap(1000, $1)", [at])


def _now(conn: SyncConnection) -> datetime:
    (now,) = conn.execute("SELECT clock_timestamp()").fetchone() or ()
    result: datetime = now
    return result


async def test_off_by_default(driver: Driver, sync_conn: SyncConnection) -> None:
    job = (
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
        )
    ).job_id
    _reap_at(sync_conn, _now(sync_conn) + timedelta(days=1))
    assert (await readers.job(driver, job)).priority_class == 2


async def test_a_waiting_job_climbs_a_class_per_wait_and_overtakes(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    _aging_on(sync_conn)
    old = (
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
        )
    ).job_id  # class 2
    start = _now(sync_conn) - timedelta(seconds=50)
    sync_conn.execute("UPDATE fleetq.jobs SET created_at = $1 WHERE id = $2", [start, old])
    gate = (
        await producer.submit(
            driver, project="webapp", operation="unit", commit=SHA, submitted_by="a"
        )
    ).job_id  # class 1, submitted (as the reaper's clock sees it) 50 s after `old`
    _reap_at(sync_conn, start + timedelta(seconds=AFTER_S - 5))
    assert (await readers.job(driver, old)).priority_class == 2  # not yet
    _reap_at(sync_conn, start + timedelta(seconds=AFTER_S + 1))
    _reap_at(sync_conn, start + timedelta(seconds=AFTER_S + 2))  # once per wait, not per pass
    assert [(await readers.job(driver, j)).priority_class for j in (old, gate)] == [1, 1]
    runner = await fleet.runner(driver, lanes={"checks": 1, "control": 1})
    (first,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    assert first.job_id == old  # it overtook the younger class-1 job


async def test_promotion_stops_at_class_zero(driver: Driver, sync_conn: SyncConnection) -> None:
    _aging_on(sync_conn)
    job = (
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
        )
    ).job_id
    start = _now(sync_conn)
    for waits in (1, 2, 3, 9):
        _reap_at(sync_conn, start + timedelta(seconds=waits * AFTER_S + 1))
    promoted = [
        e.detail["priority_class"]
        for e in await readers.events(driver, job_id=job)
        if e.kind == "promoted"
    ]
    assert promoted == [1, 0]
    assert (await readers.job(driver, job)).priority_class == 0


async def test_a_pass_that_held_queued_jobs_wakes_their_lanes(
    driver: Driver, sync_conn: SyncConnection, db_dsn: str
) -> None:
    """Aging holds the queued jobs it looks at (FOR UPDATE) until its pass commits; a
    claim meanwhile skips them (SKIP LOCKED), may find nothing, and its runner then
    looked again only at its next poll (up to --poll-max). The pass wakes the lanes whose
    jobs it held; a pass that held nothing wakes nobody."""
    _aging_on(sync_conn)
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="a")
    with fleet.wakeups(db_dsn) as idle:
        _reap_at(sync_conn, _now(sync_conn))  # nothing has waited long enough
    assert idle == []
    with fleet.wakeups(db_dsn) as heard:
        _reap_at(sync_conn, _now(sync_conn) + timedelta(seconds=AFTER_S + 1))
    assert heard == ["checks"]
