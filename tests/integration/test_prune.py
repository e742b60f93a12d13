"""`fleetq prune --before DATE` (fleetq/core/prune.py, migrations/protocol/prune.sql): the
history of jobs that ended before DATE goes, with every row that names them, in batches
that each commit on their own; nothing live, nothing still settling, nothing a job that
stays depends on, and no row another transaction holds (skipped, never waited for). Only
an administrator may prune."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, LiteralString

import psycopg
import pytest
from psycopg import sql

from fleetq.cli.main import main as fleetq
from fleetq.core import leasing, output, producer, prune, roles
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import Driver, PsycopgDriver
from fleetq.core.errors import InvalidInput, PermissionDenied
from fleetq.core.models import JobId, Outcome, OutcomeReport, RunnerId, StartReport
from tests import factories, fleet
from tests.fleet import SHA
from tests.integration.conftest import Cli, Login

Rows = dict[tuple[str, str], int]
LINT = ("tools", "lint")


async def _clock(driver: Driver) -> datetime:
    (row,) = await driver.fetch("SELECT clock_timestamp() AS now")
    return row["now"]  # type: ignore[no-any-return]


def _references(conn: SyncConnection) -> list[tuple[str, str]]:
    """Every (table, column) that names a job: each foreign key to jobs, found in the
    catalog (a table added later is covered, or this test says it is not), events, and
    the references the protocol keeps without a foreign key (migration 0024)."""
    rows = conn.execute(
        "SELECT c.conrelid::regclass::text, a.attname FROM pg_constraint c "
        "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1] "
        "WHERE c.contype = 'f' AND c.confrelid = 'fleetq.jobs'::regclass ORDER BY 1, 2"
    ).fetchall()
    unkeyed = {
        ("fleetq.busy_renewals", "job_id"),
        ("fleetq.events", "job_id"),
        ("fleetq.executions", "job_id"),
        ("fleetq.verdicts", "job_id"),
    }
    return sorted({(str(t), str(c)) for t, c in rows} | unkeyed)


def _rows(conn: SyncConnection, ids: Sequence[int]) -> Rows:
    """How many rows name any of `ids`, per table and column, jobs included."""
    counts: Rows = {}
    for table, column in [("fleetq.jobs", "id"), *_references(conn)]:
        schema, name = table.split(".")
        query = sql.SQL("SELECT count(*) FROM {} WHERE {} = ANY ($1)").format(
            sql.Identifier(schema, name), sql.Identifier(column)
        )
        row = conn.execute(query, [list(ids)]).fetchone()
        counts[(table, column)] = int(row[0]) if row else 0
    return counts


def _count(conn: SyncConnection, query: LiteralString, *args: object) -> int:
    row = conn.execute(query, list(args)).fetchone()
    assert row is not None
    return int(row[0])


async def _ran(
    driver: Driver,
    runner: RunnerId,
    *,
    outcome: Outcome = Outcome.SUCCEEDED,
    after: list[int] | None = None,
    task: str | None = None,
) -> JobId:
    """A job through the whole protocol: submitted, claimed, started, its output shipped,
    ended (a verdict, events, a task notification when it has a task)."""
    answer = await producer.submit(
        driver,
        project="tools",
        operation="lint",
        commit=SHA,
        submitted_by="a",
        after=after,
        task_id=task,
    )
    job = answer.job_id
    (claim,) = [
        c
        for c in await leasing.claim(driver, runner=runner, lane="checks", limit=8)
        if c.job_id == job
    ]
    start = StartReport(
        job_id=job,
        lease_version=claim.lease_version,
        node="node-a",
        run_id=uuid.uuid4(),
        pid=4242,
        process_started_at=None,
    )
    await leasing.report_start(driver, runner=runner, start=start)
    await output.append(
        driver,
        runner=runner,
        job_id=job,
        token=claim.lease_version,
        seq=0,
        start=0,
        data=b"checked\n",
    )
    report = OutcomeReport(
        job_id=job,
        lease_version=claim.lease_version,
        outcome=outcome,
        exit_code=0 if outcome == Outcome.SUCCEEDED else 1,
    )
    await leasing.complete(driver, runner=runner, outcome=report)
    return job


async def _fired_and_cancelled(
    driver: Driver, conn: SyncConnection, name: str = "nightly"
) -> JobId:
    """A job a schedule fired (its tick names it), cancelled while queued."""
    conn.execute(
        "INSERT INTO fleetq.schedules (name, cron, project, operation, commit_sha) "
        "VALUES ($1, '0 3 * * *', 'tools', 'lint', $2)",
        [name, SHA],
    )
    (row,) = await driver.fetch(
        "SELECT job_id FROM fleetq.fire_schedule($1, "
        "clock_timestamp() + interval '1 day', $2::text)",
        name,
        SHA,
    )
    job = JobId(row["job_id"])
    await producer.cancel(driver, job_id=job, actor="ops", reason="not tonight")
    return job


def _ended(conn: SyncConnection, at: datetime, state: str = "succeeded", **columns: Any) -> int:
    """A job that ended at `at`, submitted a day before."""
    return factories.job(
        conn, op=LINT, state=state, created_at=at - timedelta(days=1), finished_at=at, **columns
    )


async def test_jobs_that_ended_before_the_cutoff_go_with_every_row_that_names_them(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver)  # a runner_registered event, tied to no job
    a = await _ran(driver, runner, task="T-1")
    b = await _ran(driver, runner, outcome=Outcome.FAILED, after=[a])
    c = await _fired_and_cancelled(driver, sync_conn)
    old = [a, b, c]
    cutoff = await _clock(driver)
    newer = [await _ran(driver, runner, task="T-2")]
    newer.append(
        (
            await producer.submit(
                driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
            )
        ).job_id
    )
    newer.append(await _fired_and_cancelled(driver, sync_conn, "hourly"))
    # a renewal answered busy, recorded for a job of each side (migration 0039)
    sync_conn.execute(
        "INSERT INTO fleetq.busy_renewals (job_id, lease_version, lease_expires_at) "
        "SELECT unnest($1::bigint[]), 1, clock_timestamp()",
        [[a, newer[0]]],
    )
    await fleet.runner(driver, "r2", node="node-b")  # an event of no job, after the cutoff
    old_rows, newer_rows = _rows(sync_conn, old), _rows(sync_conn, newer)
    assert all(old_rows.values()), old_rows  # the old history names a job in every table
    jobless = "SELECT count(*) FROM fleetq.events WHERE job_id IS NULL AND at < $1"

    summary = await prune.prune(driver, before=cutoff)

    assert set(_rows(sync_conn, old).values()) == {0}, _rows(sync_conn, old)
    assert _rows(sync_conn, newer) == newer_rows
    assert _count(sync_conn, jobless, cutoff) == 0
    assert _count(sync_conn, "SELECT count(*) FROM fleetq.events WHERE job_id IS NULL") == 1
    r = summary.removed
    assert (r.jobs, r.executions, r.verdicts, r.outputs, r.notifications, r.ticks) == (
        3,
        old_rows[("fleetq.executions", "job_id")],
        old_rows[("fleetq.verdicts", "job_id")],
        old_rows[("fleetq.job_output", "job_id")],
        old_rows[("fleetq.task_notifications", "job_id")],
        old_rows[("fleetq.schedule_ticks", "job_id")],
    )
    assert r.dependencies == 1  # b's on a, named from both ends
    assert r.events == old_rows[("fleetq.events", "job_id")] + 1  # and the first runner's
    assert (summary.before, summary.dry_run, summary.kept.total) == (cutoff, False, 0)
    # a pruned job is gone for good: its result is no longer known
    rows = await driver.fetch("SELECT job_id FROM fleetq.results WHERE job_id = ANY ($1)", old)
    assert rows == []


async def test_nothing_live_and_nothing_still_settling_goes(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    now = await _clock(driver)
    cutoff, ended, long_ago = (
        now - timedelta(days=1),
        now - timedelta(days=5),
        now - timedelta(days=30),
    )
    owner = factories.runner(sync_conn, "node-z", "old")
    live = [
        factories.job(sync_conn, op=LINT, state="waiting", created_at=long_ago),
        factories.job(sync_conn, op=LINT, state="waiting", created_at=long_ago, retry_at=now),
        factories.job(sync_conn, op=LINT, state="queued", created_at=long_ago),
        factories.job(sync_conn, op=LINT, state="claimed", created_at=long_ago, owner=owner),
        factories.job(sync_conn, op=LINT, state="running", created_at=long_ago, owner=owner),
    ]
    stop_pending = _ended(sync_conn, ended, "cancelled", reserved_on=owner)
    run_open = _ended(sync_conn, ended, "failed")
    sync_conn.execute(
        "INSERT INTO fleetq.executions (job_id, lease_version, runner_id, node, run_id) "
        "VALUES ($1, 1, $2, 'node-z', $3)",
        [run_open, owner, uuid.uuid4()],
    )
    # a stop not confirmed whose run has an end all the same (mutant
    # prune-takes-a-stop-pending-job-whose-run-ended)
    sync_conn.execute(
        "INSERT INTO fleetq.executions (job_id, lease_version, runner_id, node, run_id, "
        "ended_at) VALUES ($1, 1, $2, 'node-z', $3, $4)",
        [stop_pending, owner, uuid.uuid4(), ended],
    )
    late = _ended(sync_conn, ended, "cancelled")  # something recorded about it since
    sync_conn.execute(
        "INSERT INTO fleetq.events (kind, job_id, runner_id, lease_version) "
        "VALUES ('stale_write', $1, $2, 1)",
        [late, owner],
    )
    plain = _ended(sync_conn, ended)
    for job, at in ((live[0], long_ago), (stop_pending, ended)):  # their old history stays
        sync_conn.execute(
            "INSERT INTO fleetq.events (at, kind, job_id) VALUES ($1, 'submitted', $2)", [at, job]
        )
    await fleet.runner(driver)  # the newest event
    kept = [*live, stop_pending, run_open, late]
    kept_rows = _rows(sync_conn, kept)

    summary = await prune.prune(driver, before=cutoff)
    assert _rows(sync_conn, kept) == kept_rows
    remaining = {int(r[0]) for r in sync_conn.execute("SELECT id FROM fleetq.jobs").fetchall()}
    assert remaining == set(kept)
    assert (summary.removed.jobs, summary.kept.unsettled) == (1, 3)
    assert plain not in remaining

    # once the stop is confirmed and the run's end reported, they go; the rest stays
    sync_conn.execute("UPDATE fleetq.jobs SET reserved_on = NULL WHERE id = $1", [stop_pending])
    sync_conn.execute(
        "UPDATE fleetq.executions SET ended_at = $1 WHERE job_id = $2", [ended, run_open]
    )
    summary = await prune.prune(driver, before=cutoff)
    assert (summary.removed.jobs, summary.kept.unsettled) == (2, 1)
    assert _rows(sync_conn, live)[("fleetq.jobs", "id")] == len(live)


async def test_a_dependency_of_a_job_that_stays_stays_and_still_resolves(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """W waits on X (ended long ago) and Y (running): X stays, and when Y succeeds W is
    queued. Down a chain too: R (queued) depends on Q, which depends on P, both ended
    long ago: both stay. S stays while T, which ended after the cutoff, depends on it. U
    and V, which depends on it, both ended long ago: both go."""
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver)
    y_job = (
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
        )
    ).job_id
    (y,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    now = await _clock(driver)
    cutoff, ended = now - timedelta(days=1), now - timedelta(days=5)
    x, p, q, s, u = (_ended(sync_conn, ended) for _ in range(5))
    v = _ended(sync_conn, ended, "failed")
    w = factories.job(sync_conn, op=LINT, state="waiting")
    r = factories.job(sync_conn, op=LINT, state="queued")
    t = factories.job(sync_conn, op=LINT, state="succeeded")  # ended now: after the cutoff
    for job, on in ((w, x), (w, y_job), (q, p), (r, q), (t, s), (v, u)):
        sync_conn.execute(
            "INSERT INTO fleetq.job_dependencies (job_id, depends_on) VALUES ($1, $2)", [job, on]
        )

    summary = await prune.prune(driver, before=cutoff)

    gone = {x, p, q, s, u, v} - {
        int(row[0]) for row in sync_conn.execute("SELECT id FROM fleetq.jobs").fetchall()
    }
    assert gone == {u, v}
    assert (summary.removed.jobs, summary.removed.dependencies, summary.kept.needed) == (2, 1, 4)
    report = OutcomeReport(
        job_id=y.job_id, lease_version=y.lease_version, outcome=Outcome.SUCCEEDED
    )
    await leasing.complete(driver, runner=runner, outcome=report)
    state = "SELECT state FROM fleetq.jobs WHERE id = $1"
    assert sync_conn.execute(state, [w]).fetchone() == ("queued",)


async def test_batches_commit_one_by_one_and_the_walk_stops_at_newer_jobs(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """With --batch 1, five old jobs go in five transactions: each batch is committed
    (seen from another session) before the next starts. The walk stops at the first job
    submitted after the cutoff, without reading the newer ones."""
    fleet.operations(sync_conn)
    now = await _clock(driver)
    cutoff = now - timedelta(days=1)
    old = [_ended(sync_conn, now - timedelta(days=5)) for _ in range(5)]
    for _ in range(3):
        factories.job(sync_conn, op=LINT, state="queued")
    left: list[int] = []

    def progress(batch: prune.Batch) -> None:
        if batch.phase == "jobs":
            left.append(
                _count(sync_conn, "SELECT count(*) FROM fleetq.jobs WHERE id = ANY ($1)", old)
            )

    summary = await prune.prune(driver, before=cutoff, batch=1, progress=progress)
    assert left == [4, 3, 2, 1, 0, 0]
    assert summary.removed.jobs == 5
    assert summary.batches >= 6


async def test_a_dry_run_counts_what_would_go_and_deletes_nothing(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver)
    a = await _ran(driver, runner, task="T-1")
    b = await _ran(driver, runner, outcome=Outcome.FAILED, after=[a])
    cutoff = await _clock(driver)
    await fleet.runner(driver, "r2", node="node-b")  # the newest event, which stays
    everything = "SELECT count(*) FROM fleetq.events"
    rows, events = _rows(sync_conn, [a, b]), _count(sync_conn, everything)

    dry = await prune.prune(driver, before=cutoff, dry_run=True, batch=1)
    assert (_rows(sync_conn, [a, b]), _count(sync_conn, everything)) == (rows, events)
    assert dry.dry_run and dry.removed.jobs == 2

    real = await prune.prune(driver, before=cutoff)
    assert real.removed == dry.removed
    assert set(_rows(sync_conn, [a, b]).values()) == {0}


@pytest.mark.parametrize(
    ("kind", "subject"),
    [
        (roles.Kind.RUNNER, "node-a/r1"),
        (roles.Kind.SUBMITTER, "alice"),
        (roles.Kind.OPERATOR, "ops"),
        (roles.Kind.READER, "dashboard"),
        (roles.Kind.GATEWAY, "api"),
    ],
)
async def test_only_an_administrator_may_prune(
    login: Login, driver: Driver, sync_conn: SyncConnection, kind: roles.Kind, subject: str
) -> None:
    now = await _clock(driver)
    job = _ended(sync_conn, now - timedelta(days=5))
    as_login = await PsycopgDriver.connect(login(kind, subject))
    try:
        with pytest.raises(PermissionDenied, match="administrator"):
            await prune.prune(as_login, before=now - timedelta(days=1))
    finally:
        await as_login.close()
    assert _count(sync_conn, "SELECT count(*) FROM fleetq.jobs WHERE id = $1", job) == 1


LOCKS: dict[str, LiteralString] = {
    # a cancel (or a late outcome) reading an ended job
    "update": "SELECT 1 FROM fleetq.jobs WHERE id = $1 FOR UPDATE",
    # a submit naming it in --after: the dependency's foreign key
    "key share": "SELECT 1 FROM fleetq.jobs WHERE id = $1 FOR KEY SHARE",
}


@pytest.fixture
def holder(db_dsn: str) -> Iterator[SyncConnection]:
    """Another session, which will hold a job's row in a transaction left open."""
    with connect(db_dsn) as conn:
        yield conn
        conn.rollback()


@pytest.mark.parametrize("lock", sorted(LOCKS))
async def test_a_row_another_transaction_holds_is_skipped_never_waited_for(
    driver: Driver, sync_conn: SyncConnection, holder: SyncConnection, lock: str
) -> None:
    fleet.operations(sync_conn)
    now = await _clock(driver)
    cutoff, ended = now - timedelta(days=1), now - timedelta(days=5)
    held, free = _ended(sync_conn, ended), _ended(sync_conn, ended)
    holder.execute(LOCKS[lock], [held])

    async with asyncio.timeout(10):  # waiting on the row would never end
        summary = await prune.prune(driver, before=cutoff)
    assert (summary.removed.jobs, summary.kept.held) == (1, 1)
    assert _count(sync_conn, "SELECT count(*) FROM fleetq.jobs WHERE id = $1", free) == 0

    holder.rollback()  # a later prune takes it
    summary = await prune.prune(driver, before=cutoff)
    assert (summary.removed.jobs, summary.kept.held) == (1, 0)
    assert _count(sync_conn, "SELECT count(*) FROM fleetq.jobs WHERE id = $1", held) == 0


async def test_old_events_of_no_job_go_and_the_newest_event_always_stays(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """The console notices news by polling max(events.id): a prune never deletes the
    newest event, so that never goes back, even when it belongs to a job that goes. A
    later prune, once newer events exist, takes it."""
    fleet.operations(sync_conn)
    now = await _clock(driver)
    ended = now - timedelta(days=5)
    job = _ended(sync_conn, ended)
    sync_conn.execute(
        "INSERT INTO fleetq.events (at, kind, runner_id) VALUES ($1, 'runner_registered', 'x/y')",
        [ended - timedelta(hours=1)],
    )
    sync_conn.execute(
        "INSERT INTO fleetq.events (at, kind, job_id, lease_version) "
        "VALUES ($1, 'succeeded', $2, 1)",
        [ended, job],
    )
    newest = _count(sync_conn, "SELECT max(id) FROM fleetq.events")

    summary = await prune.prune(driver, before=now - timedelta(days=1))
    assert (summary.removed.jobs, summary.removed.events) == (1, 1)
    assert _count(sync_conn, "SELECT max(id) FROM fleetq.events") == newest
    assert _count(sync_conn, "SELECT count(*) FROM fleetq.events") == 1

    await fleet.runner(driver)  # news
    summary = await prune.prune(driver, before=await _clock(driver))
    assert summary.removed.events == 1
    kinds = sync_conn.execute("SELECT kind FROM fleetq.events").fetchall()
    assert kinds == [("runner_registered",)]


def test_events_stay_append_only_outside_a_prune(db_dsn: str, sync_conn: SyncConnection) -> None:
    """Only a transaction that names a cutoff (as prune does) deletes events, and only
    those older than it; nobody updates one."""
    sync_conn.execute(
        "INSERT INTO fleetq.events (at, kind) VALUES (clock_timestamp() - interval '2 days', 'a'), "
        "(clock_timestamp(), 'b')"
    )
    refused = psycopg.errors.InsufficientPrivilege
    with pytest.raises(refused, match="append-only"):
        sync_conn.execute("DELETE FROM fleetq.events WHERE kind = 'a'")
    with pytest.raises(refused, match="append-only"):
        sync_conn.execute("UPDATE fleetq.events SET kind = 'c'")
    with connect(db_dsn) as conn:
        conn.execute(
            "SELECT set_config('fleetq.prune_before', "
            "extract(epoch FROM clock_timestamp() - interval '1 day')::text, true)"
        )
        with pytest.raises(refused, match="append-only"):
            conn.execute("DELETE FROM fleetq.events WHERE kind = 'b'")
        conn.rollback()
        conn.execute(
            "SELECT set_config('fleetq.prune_before', "
            "extract(epoch FROM clock_timestamp() - interval '1 day')::text, true)"
        )
        assert conn.execute("DELETE FROM fleetq.events WHERE kind = 'a'").rowcount == 1
        conn.commit()
    assert _count(sync_conn, "SELECT count(*) FROM fleetq.events") == 1


async def test_a_cutoff_that_is_not_in_the_past_is_refused_and_nothing_goes(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    now = await _clock(driver)
    job = _ended(sync_conn, now - timedelta(days=5))
    with pytest.raises(InvalidInput, match="in the past"):
        await prune.prune(driver, before=now + timedelta(hours=1))
    with pytest.raises(InvalidInput, match="in the past"):  # the database refuses it too
        await driver.fetch(
            "SELECT * FROM fleetq.prune_jobs(clock_timestamp() + interval '1 minute', 0, 10)"
        )
    with pytest.raises(InvalidInput, match="at least one job"):  # and an empty batch
        await driver.fetch("SELECT * FROM fleetq.prune_jobs(clock_timestamp(), 0, 0)")
    # the refusal names the database's clock as it refused
    with pytest.raises(InvalidInput) as refused:
        await driver.fetch("SELECT * FROM fleetq.prune_jobs('infinity', 0, 10)")
    said = re.search(r"the database's clock says ([^)]+)\)", str(refused.value))
    assert said is not None, str(refused.value)
    (told,) = sync_conn.execute("SELECT $1::text::timestamptz", [said[1]]).fetchone() or (None,)
    assert now <= told <= await _clock(driver), (now, told)
    assert _count(sync_conn, "SELECT count(*) FROM fleetq.jobs WHERE id = $1", job) == 1
    # an age is counted back from the database's clock
    summary = await prune.prune(driver, before=timedelta(days=1))
    assert now - timedelta(days=1) <= summary.before <= await _clock(driver) - timedelta(days=1)
    assert summary.removed.jobs == 1


def test_the_command_shows_each_batch_and_a_summary(cli: Cli, sync_conn: SyncConnection) -> None:
    ended = datetime.now().astimezone() - timedelta(days=5)
    for _ in range(3):
        _ended(sync_conn, ended)
    factories.job(sync_conn, op=LINT, state="queued")
    jobs = "SELECT count(*) FROM fleetq.jobs"

    code, out, err = cli("prune", "--before", "1d", "--batch", "2", "--dry-run")
    assert code == 0, err
    assert "would remove 3 jobs" in out and "batch 1" in err
    assert _count(sync_conn, jobs) == 4

    code, out, err = cli("prune", "--before", "1d", "--batch", "2")
    assert code == 0, err
    assert "removed 3 jobs" in out
    assert [line.split(":")[0] for line in err.splitlines()][:2] == ["jobs batch 1", "jobs batch 2"]
    assert _count(sync_conn, jobs) == 1

    code, out, _ = cli("prune", "--before", "1d", "--json")
    answer = json.loads(out)
    assert (code, answer["removed"]["jobs"], answer["dry_run"]) == (0, 0, False)


@pytest.mark.parametrize(
    ("before", "message"),
    [("tomorrow", "DATE"), ("-3d", "DATE"), ("2999-01-01", "in the past")],
)
def test_the_command_refuses_a_bad_date_with_exit_64(
    cli: Cli, sync_conn: SyncConnection, before: str, message: str
) -> None:
    _ended(sync_conn, datetime.now().astimezone() - timedelta(days=5))
    code, _, err = cli("prune", "--before", before)
    assert code == 64 and message in err
    assert _count(sync_conn, "SELECT count(*) FROM fleetq.jobs") == 1


def test_the_command_refuses_a_login_that_is_not_an_administrator_with_exit_77(
    login: Login, capsys: pytest.CaptureFixture[str]
) -> None:
    code = fleetq(["prune", "--before", "1d", "--dsn", login(roles.Kind.OPERATOR, "ops")])
    assert code == 77 and "administrator" in capsys.readouterr().err
