"""Queue history (migration 0012): the reaper's leader samples each lane's depth and wait
per priority class once a minute, however many runners pass; a minute nobody led is
missing (a gap, not an empty queue); a failed sample never costs the reaper its pass."""

from __future__ import annotations

from datetime import datetime, timedelta

from fleetq.core import leasing, producer, views
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import Driver
from tests import fleet
from tests.fleet import SHA


def _samples(conn: SyncConnection) -> list[tuple[datetime, str, int, int, int, float | None]]:
    rows = conn.execute(
        "SELECT at, lane, priority_class, queued, claimed, wait_p50_s FROM fleetq.queue_samples "
        "ORDER BY at, lane, priority_class"
    ).fetchall()
    return [tuple(r) for r in rows]


def _reap(conn: SyncConnection, at: datetime) -> tuple[int, int, bool]:
    row = conn.execute("SELECT * FROM fleetq.reap(1000, $1)", [at]).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), bool(row[2])


def _hold_leases(conn: SyncConnection) -> None:
    """The moved clock must not expire the leases whose jobs the depth counts out."""
    conn.execute(
        "UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() + interval '1 day' "
        "WHERE state = 'claimed'"
    )


async def _submit(driver: Driver, n: int) -> list[int]:
    return [
        (
            await producer.submit(
                driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
            )
        ).job_id
        for _ in range(n)
    ]


async def test_one_sample_a_minute_per_lane_and_class_with_depth_and_claim_wait(
    sync_conn: SyncConnection, driver: Driver
) -> None:
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver)
    await _submit(driver, 3)
    (cls,) = sync_conn.execute("SELECT DISTINCT priority_class FROM fleetq.jobs").fetchone() or ()
    await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    _hold_leases(sync_conn)
    (now,) = sync_conn.execute("SELECT clock_timestamp()").fetchone() or ()
    # the next minute's passes: the claim just made is in "the minute before"
    minute = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    for seconds in (0, 5, 30, 59):
        assert _reap(sync_conn, minute + timedelta(seconds=seconds))[2]
    samples = _samples(sync_conn)
    assert len(samples) == 2 * 3  # lanes checks and control, classes 0-2, once
    checks = {s[2]: s for s in samples if s[1] == "checks"}
    at, _lane, _cls, queued, claimed, wait = checks[cls]
    assert at == minute and queued == 2 and claimed == 1
    assert wait is not None and wait >= 0
    assert all(s[3] == 0 and s[4] == 0 for s in samples if s[1] == "control" or s[2] != cls)

    # a minute later, one more sample per lane and class; the read places both
    await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    _hold_leases(sync_conn)
    _reap(sync_conn, minute + timedelta(minutes=1, seconds=2))
    assert len(_samples(sync_conn)) == 4 * 3
    (history,) = [
        h
        for h in (await views.overview(driver, at=minute + timedelta(minutes=1, seconds=3))).history
        if h.lane == "checks" and h.priority_class == cls
    ]
    assert history.queued[-2:] == [2, 1] and history.queued[:-2] == [None] * 58
    assert history.claimed[-2:] == [1, 0]


def test_a_minute_nobody_led_is_not_sampled(db_dsn: str, sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)
    (now,) = sync_conn.execute("SELECT clock_timestamp()").fetchone() or ()
    with connect(db_dsn) as leader:
        # another reaper leads: it holds the reaper's row until its pass commits
        leader.execute("SELECT 1 FROM fleetq.coordination WHERE name = 'reaper' FOR UPDATE")
        assert _reap(sync_conn, now) == (0, 0, False)
        leader.rollback()
    assert _samples(sync_conn) == []
    assert _reap(sync_conn, now)[2]
    assert len(_samples(sync_conn)) == 6


async def test_a_failed_sample_costs_the_sample_not_the_reapers_pass(
    sync_conn: SyncConnection, driver: Driver
) -> None:
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver)
    (job,) = await _submit(driver, 1)
    await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    sync_conn.execute(
        "ALTER TABLE fleetq.queue_samples ADD CONSTRAINT refuse CHECK (queued < 0) NOT VALID"
    )
    (later,) = sync_conn.execute("SELECT clock_timestamp() + interval '1 hour'").fetchone() or ()
    assert _reap(sync_conn, later) == (1, 0, True)  # the expired lease is still recovered
    assert sync_conn.execute("SELECT state FROM fleetq.jobs WHERE id = $1", [job]).fetchone() == (
        "queued",
    )
    assert _samples(sync_conn) == []


def test_samples_older_than_a_week_are_pruned(sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)
    (now,) = sync_conn.execute("SELECT clock_timestamp()").fetchone() or ()
    _reap(sync_conn, now - timedelta(days=8))
    _reap(sync_conn, now - timedelta(days=6))
    assert len(_samples(sync_conn)) == 12
    _reap(sync_conn, now)
    assert sorted({s[0].date() for s in _samples(sync_conn)}) == sorted(
        {(now - timedelta(days=6)).date(), now.date()}
    )


async def test_a_sample_counts_the_claims_of_its_own_minute_by_the_database_s_clock(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """A sample taken in a minute is of the minute that ended: a claim made in that
    minute is not in it but in the next one; and a sample with no time given is dated by the
    database's clock, never ahead of it."""
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver)
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="a")
    assert len(await leasing.claim(driver, runner=runner, lane="checks", limit=1)) == 1
    claimed = (
        "SELECT coalesce(sum(claimed), 0) FROM fleetq.queue_samples "
        "WHERE lane = 'checks' AND at = date_trunc('minute', $1::timestamptz)"
    )
    (now,) = sync_conn.execute(
        "SELECT at FROM fleetq.events WHERE kind = 'claimed'"
    ).fetchone() or (None,)
    sync_conn.execute("SELECT fleetq.sample_queues($1)", [now])
    assert sync_conn.execute(claimed, [now]).fetchone() == (0,)
    later = now + timedelta(minutes=1)
    sync_conn.execute("SELECT fleetq.sample_queues($1)", [later])
    assert sync_conn.execute(claimed, [later]).fetchone() == (1,)
    sync_conn.execute("DELETE FROM fleetq.queue_samples")
    sync_conn.execute("SELECT fleetq.sample_queues()")
    (ahead,) = sync_conn.execute(
        "SELECT bool_or(at > clock_timestamp()) FROM fleetq.queue_samples"
    ).fetchone() or (None,)
    assert ahead is False
