"""A run's figures (`fleetq.core.report`), from rows put in place by hand: each report
query against the real schema, scoped to the run's job ids."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from fleetq.core import leasing, migrate, migrationfiles, migrationlock, report
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import Driver
from fleetq.core.models import FencingToken, JobId
from tests import factories

T0 = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)


def _at(seconds: float) -> str:
    return f"2026-01-01 10:00:{seconds:06.3f}+00"


def _event(
    conn: SyncConnection,
    kind: str,
    job: int,
    at_s: float,
    *,
    runner: str | None = None,
    token: int | None = None,
    detail: str = "{}",
) -> None:
    conn.execute(
        "INSERT INTO fleetq.events (kind, job_id, runner_id, lease_version, at, detail) "
        "VALUES ($1, $2, $3, $4, $5::timestamptz, $6::jsonb)",
        [kind, job, runner, token, _at(at_s), detail],
    )


def _execution(
    conn: SyncConnection,
    job: int,
    token: int,
    runner: str,
    **columns: object,
) -> None:
    values = {"job_id": job, "lease_version": token, "runner_id": runner, "node": "n"}
    values |= {"run_id": uuid.uuid4(), **columns}
    names = ", ".join(values)
    marks = ", ".join(f"${i}" for i in range(1, len(values) + 1))
    conn.execute(
        f"INSERT INTO fleetq.executions ({names}) VALUES ({marks})".encode(), list(values.values())
    )


async def test_states_count_every_job_and_a_missing_one_is_lost(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    ok = factories.job(sync_conn, state="succeeded")
    timed_out = factories.job(sync_conn, state="failed", failure_reason="timeout")
    queued = factories.job(sync_conn)
    factories.job(sync_conn, state="succeeded")  # another run's job: not counted

    counts = await report.states(driver, [ok, timed_out, queued])
    assert [(s.state, s.reason, s.jobs) for s in counts] == [
        ("failed", "timeout", 1),
        ("queued", "", 1),
        ("succeeded", "", 1),
    ]
    figures = await report.gather(
        driver, [ok, timed_out, queued, 999_999], start=datetime.now(UTC), interval_s=5
    )
    assert (figures.accepted, figures.found, figures.lost, figures.unsettled) == (4, 3, 1, 1)


async def test_live_jobs_newest_launch_first(driver: Driver, sync_conn: SyncConnection) -> None:
    runner = factories.runner(sync_conn)
    older = factories.job(sync_conn, state="running", owner=runner, lease_version=2)
    _execution(sync_conn, older, 2, runner, launched_at="2026-01-01 10:00:00+00")
    newer = factories.job(sync_conn, state="running", owner=runner)
    _execution(sync_conn, newer, 1, runner, launched_at="2026-01-01 10:00:05+00")
    _execution(sync_conn, older, 1, runner, launched_at="2026-01-01 10:00:09+00")  # old token
    queued = factories.job(sync_conn)
    done = factories.job(sync_conn, state="succeeded")

    live = await report.live(driver, [older, newer, queued, done])
    assert [(j.job_id, j.state, j.lease_version) for j in live] == [
        (newer, "running", 1),
        (older, "running", 2),
        (queued, "queued", 0),
    ]
    newest, older_launch = live[0].running_s, live[1].running_s
    assert newest is not None and older_launch is not None
    assert older_launch - newest == pytest.approx(5.0, abs=0.5)
    assert (live[2].launched_at, live[2].running_s) == (None, None)


async def test_queue_wait_counts_the_first_claim_only(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    runner = factories.runner(sync_conn)
    gate = factories.job(sync_conn, state="succeeded", priority_class=1, created_at=_at(0))
    _event(sync_conn, "claimed", gate, 2, runner=runner, token=1)
    _event(sync_conn, "claimed", gate, 30, runner=runner, token=2)  # after a fault: recovery
    other = factories.job(sync_conn, state="succeeded", created_at=_at(0))
    _event(sync_conn, "claimed", other, 4, runner=runner, token=1)
    never = factories.job(sync_conn, state="cancelled", created_at=_at(0))

    waits = await report.gather(driver, [gate, other, never], start=T0, interval_s=5)
    assert [(w.priority_class, w.project, w.jobs, w.max_s) for w in waits.queue_wait] == [
        (1, "webapp", 1, 2.0),
        (2, "webapp", 1, 4.0),
    ]


async def test_phases_and_placement(driver: Driver, sync_conn: SyncConnection) -> None:
    a = factories.runner(sync_conn, "node-a")
    b = factories.runner(sync_conn, "node-b")
    factories.operation(sync_conn, name="slow")
    jobs = [factories.job(sync_conn, state="succeeded") for _ in range(2)]
    slow = factories.job(sync_conn, op=("webapp", "slow"), state="succeeded")
    for job, prepare, run in zip([*jobs, slow], [10, 30, 20], [100, 300, 8000], strict=True):
        _execution(
            sync_conn, job, 1, a, launched_at=_at(1), prepare_ms=prepare, run_ms=run, exit_code=0
        )
    _execution(sync_conn, slow, 2, b)  # claimed, never launched: no phase figures
    for job in jobs:
        _event(sync_conn, "claimed", job, 1, runner=a, token=1)
    _event(sync_conn, "claimed", slow, 1, runner=b, token=1)

    figures = await report.gather(driver, [*jobs, slow], start=T0, interval_s=5)
    assert [(p.operation, p.runs, p.prepare_p50_ms, p.run_max_ms) for p in figures.phases] == [
        ("slow", 1, 20.0, 8000),
        ("unit", 2, 20.0, 300),
    ]
    assert [(p.runner_id, p.operation, p.claims) for p in figures.placement] == [
        (a, "unit", 2),
        (b, "slow", 1),
    ]


async def test_completed_per_interval_lists_empty_intervals(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    jobs = [
        factories.job(sync_conn, state="succeeded", finished_at=_at(1)),
        factories.job(sync_conn, state="failed", finished_at=_at(4)),
        factories.job(sync_conn, state="succeeded", finished_at=_at(12)),
        factories.job(sync_conn, state="cancelled", finished_at=_at(2)),  # not an outcome
    ]
    figures = await report.gather(driver, jobs, start=T0, interval_s=5)
    assert [(c.bucket, c.succeeded, c.failed) for c in figures.completed] == [
        (0, 1, 1),
        (1, 0, 0),
        (2, 1, 0),
    ]


async def test_recoveries_stops_and_stale_rejections(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    a = factories.runner(sync_conn, "node-a")
    c = factories.runner(sync_conn, "node-c")
    job = factories.job(sync_conn, state="succeeded")
    _event(sync_conn, "claimed", job, 0, runner=a, token=1)
    _event(sync_conn, "lease_expired", job, 3, runner=a, token=1)
    _event(sync_conn, "claimed", job, 3.5, runner=c, token=2)
    _event(sync_conn, "stale_rejected", job, 6, runner=a, token=1, detail='{"write": "heartbeat"}')
    _event(sync_conn, "stale_rejected", job, 6, runner=a, token=1, detail='{"write": "outcome"}')
    stuck = factories.job(sync_conn)
    _event(sync_conn, "lost", stuck, 1, runner=a, token=1)
    _execution(sync_conn, job, 1, a, stop_reason="superseded", stop_confirmed=True, signal=15)
    _execution(sync_conn, job, 2, c, exit_code=0)

    figures = await report.gather(driver, [job, stuck], start=T0, interval_s=5)
    assert [(r.job_id, r.kind, r.lost_by, r.claimed_by, r.delay_s) for r in figures.recoveries] == [
        (job, "lease_expired", a, c, 0.5),
        (stuck, "lost", a, None, None),
    ]
    assert [(s.job_id, s.runner_id, s.stop_reason, s.signal) for s in figures.stops] == [
        (job, a, "superseded", 15)
    ]
    assert figures.superseded_confirmed() == figures.stops
    assert figures.stale_rejections == {"heartbeat": 1, "outcome": 1}


async def test_overlaps_and_ledger_of_the_run_only(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    a = factories.runner(sync_conn, "node-a")
    b = factories.runner(sync_conn, "node-b")
    mine, other = (factories.job(sync_conn, state="succeeded") for _ in range(2))
    for job in (mine, other):
        _execution(sync_conn, job, 1, a, launched_at=_at(0), ended_at=_at(5), stop_confirmed=True)
        _execution(sync_conn, job, 2, b, launched_at=_at(3), ended_at=_at(9), exit_code=0)
    for job, token in ((mine, 2), (mine, 1), (other, 1)):
        await leasing.fenced_write(
            driver, key=f"job-{job}", job_id=JobId(job), token=FencingToken(token), value={}
        )

    figures = await report.gather(driver, [mine], start=T0, interval_s=5)
    assert [(o.job_id, o.seconds(figures.read_at)) for o in figures.overlaps] == [(mine, 2.0)]
    assert (figures.ledger_writes, figures.ledger_refused, figures.ledger_violations) == (2, 1, 0)


async def test_runners_and_clock(driver: Driver, sync_conn: SyncConnection) -> None:
    a = factories.runner(sync_conn, "node-a")
    factories.runner(sync_conn, "node-b", state="draining")
    sync_conn.execute("UPDATE fleetq.runners SET pid = 4242 WHERE id = $1", [a])
    rows = await report.runners(driver, [a, "node-b/r1", "node-z/r1"])
    assert [(r.id, r.pid, r.state, r.stale) for r in rows] == [
        (a, 4242, "active", False),
        ("node-b/r1", None, "draining", False),
    ]
    assert (await report.clock(driver)).tzinfo is not None


def test_reset_drops_the_schema_and_migrate_rebuilds_it(db_dsn: str) -> None:
    with connect(db_dsn, autocommit=True) as conn:
        factories.job(conn)
    migrationlock.reset(db_dsn)
    with connect(db_dsn) as conn:
        assert conn.execute("SELECT to_regnamespace('fleetq')").fetchone() == (None,)
    assert len(migrate.migrate(db_dsn)) == len(migrationfiles.discover())
    with connect(db_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM fleetq.jobs").fetchone() == (0,)
