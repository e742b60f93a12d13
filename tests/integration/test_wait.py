"""A CI gate waits for its verdict (issue 42, finding 7): `fleetq wait JOB…`, `result
--wait` and `logs --exit-status` block until the jobs end, woken by the database (an
ending notifies only the jobs someone watches), and exit as `fleetq result` does."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import Future, ThreadPoolExecutor

import psycopg
import pytest

from fleetq.cli.main import main as fleetq
from fleetq.core import leasing, producer, waiting
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import Driver
from fleetq.core.models import Claim, JobId, Outcome, OutcomeReport, RunnerId
from tests import fleet
from tests.fleet import SHA
from tests.integration.conftest import Cli


@pytest.fixture(autouse=True)
def _no_resync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a notification can wake a waiter here: without one a test hangs, then fails."""
    monkeypatch.setattr(waiting, "RESYNC_S", 3600.0)


async def _claimed(driver: Driver, runner: RunnerId) -> Claim:
    job = (
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
        )
    ).job_id
    (claim,) = [
        c
        for c in await leasing.claim(driver, runner=runner, lane="checks", limit=8)
        if c.job_id == job
    ]
    return claim


async def _end(
    driver: Driver, runner: RunnerId, claim: Claim, outcome: Outcome, **report: object
) -> None:
    done = OutcomeReport(
        job_id=claim.job_id, lease_version=claim.lease_version, outcome=outcome, **report
    )
    await leasing.complete(driver, runner=runner, outcome=done)


BOUND_S = 90  # a waiter gives up by then, so a test that failed leaves no thread behind


async def _done(command: Future[int]) -> int:
    """The background command's status, once the ending woke it (10 s at most, where a
    notification takes milliseconds: a waiter only a resync would wake fails here)."""
    return await asyncio.wait_for(asyncio.wrap_future(command), 10)


def _in_background(db_dsn: str, *argv: str) -> Future[int]:
    pool = ThreadPoolExecutor(1)
    future = pool.submit(fleetq, ["--dsn", db_dsn, *argv])
    pool.shutdown(wait=False)
    return future


async def _watched(sync_conn: SyncConnection, job: JobId) -> None:
    """Until a session watches `job` (the waiter is past its LISTEN and its first read)."""
    deadline = time.monotonic() + 30
    query = b"SELECT count(*) FROM fleetq.job_watchers WHERE job_id = $1"
    while sync_conn.execute(query, [job]).fetchone() != (1,):
        assert time.monotonic() < deadline, "no waiter watches the job"
        await asyncio.sleep(0.02)  # polling the table for the waiter's row, not timing it


@pytest.mark.parametrize(
    ("outcome", "report", "status", "line"),
    [
        (Outcome.SUCCEEDED, {"exit_code": 0}, 0, "passed"),
        (Outcome.FAILED, {"exit_code": 9}, 1, "failed (exit 9)"),
        (Outcome.FAILED, {"reason": "launch failed: cannot run pytset"}, 3, "error"),
    ],
)
async def test_wait_wakes_when_the_job_ends_and_exits_with_its_verdict(
    driver: Driver,
    sync_conn: SyncConnection,
    db_dsn: str,
    capsys: pytest.CaptureFixture[str],
    outcome: Outcome,
    report: dict[str, object],
    status: int,
    line: str,
) -> None:
    fleet.operations(sync_conn)
    sync_conn.commit()
    runner = await fleet.runner(driver)
    claim = await _claimed(driver, runner)
    waiter = _in_background(db_dsn, "wait", str(claim.job_id), "--timeout", str(BOUND_S))
    await _watched(sync_conn, claim.job_id)
    await _end(driver, runner, claim, outcome, **report)
    assert await _done(waiter) == status
    assert f"job {claim.job_id} {line}" in capsys.readouterr().out
    watchers = sync_conn.execute(b"SELECT count(*) FROM fleetq.job_watchers").fetchone()
    assert watchers == (0,)  # the waiter watches nothing once it is done


async def test_what_a_gate_reads_is_the_job_s_own(
    driver: Driver, sync_conn: SyncConnection, cli: Cli
) -> None:
    """Found trying it as a user (issue 42): `wait --json` named the operation "job N",
    with no recorded_at or output; `result --wait --timeout` that ran out beside a live
    rerun answered the older verdict, 0; `--timeout nan` waited for ever, `-1` was taken."""
    runner = await fleet.runner(driver)
    claim = await _claimed(driver, runner)
    await _end(driver, runner, claim, Outcome.SUCCEEDED, exit_code=0, log_tail="all good\n")
    code, out, _ = cli("wait", str(claim.job_id), "--json")
    (answer,) = json.loads(out)
    assert code == 0 and answer["operation"] == "lint" and answer["recorded_at"], answer
    assert answer["log_tail"] == "all good\n"
    rerun = await _claimed(driver, runner)  # the same check again, live
    code, _, err = cli("result", "tools", SHA, "--wait", "--timeout", "0.2")
    assert code == 2 and f"job {rerun.job_id} has decided nothing yet" in err, err
    for bad in ("-1", "nan", "inf", "-inf", "soon"):
        assert cli("wait", str(claim.job_id), "--timeout", bad)[0] == 64, bad
        assert cli("result", "tools", SHA, "--wait", "--timeout", bad)[0] == 64, bad
    code, _, err = cli("logs", str(claim.job_id), "--token", "0")
    assert code == 64 and "is not a token" in err, err


async def test_an_ending_nobody_watches_sends_nothing(
    driver: Driver, sync_conn: SyncConnection, db_dsn: str
) -> None:
    """A NOTIFY serializes the commits that send it: an ending notifies only when someone
    waits on that job."""
    fleet.operations(sync_conn)
    sync_conn.commit()
    runner = await fleet.runner(driver)
    unwatched, watched = await _claimed(driver, runner), await _claimed(driver, runner)
    with connect(db_dsn, autocommit=True) as listener:
        listener.execute(b"LISTEN fleetq_done")
        with connect(db_dsn, autocommit=True) as waiter:
            waiter.execute(b"SELECT * FROM fleetq.watch_jobs($1)", [[watched.job_id]])
            await _end(driver, runner, unwatched, Outcome.SUCCEEDED, exit_code=0)
            await _end(driver, runner, watched, Outcome.SUCCEEDED, exit_code=0)
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert heard == [str(watched.job_id)]


async def test_cancelled_unknown_and_timed_out(
    driver: Driver, sync_conn: SyncConnection, cli: Cli
) -> None:
    runner = await fleet.runner(driver)
    claim = await _claimed(driver, runner)
    code, out, _ = cli("wait", str(claim.job_id), "--timeout", "0.2")
    assert code == 2 and f"job {claim.job_id} still claimed (not decided)" in out, out
    queued = (
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
        )
    ).job_id
    assert cli("cancel", str(queued), "--reason", "not needed")[0] == 0
    code, out, _ = cli("wait", str(queued))
    assert code == 2 and f"job {queued} cancelled: not needed" in out, out
    code, _, err = cli("wait", str(queued), "424242")
    assert code == 65 and "no job 424242" in err, err


async def test_result_and_logs_wait_for_the_verdict(
    driver: Driver, sync_conn: SyncConnection, db_dsn: str, cli: Cli
) -> None:
    runner = await fleet.runner(driver)
    claim = await _claimed(driver, runner)
    gate = _in_background(db_dsn, "result", "tools", SHA, "--wait", "--timeout", str(BOUND_S))
    await _watched(sync_conn, claim.job_id)
    await _end(driver, runner, claim, Outcome.FAILED, exit_code=1)
    assert await _done(gate) == 1
    code, _, err = cli("logs", str(claim.job_id), "--exit-status")
    assert code == 1 and f"job {claim.job_id} failed (exit 1)" in err, err
    assert cli("logs", str(claim.job_id))[0] == 0  # without the flag: the output's status


def test_a_waiter_touches_only_its_own_rows(sync_conn: SyncConnection, db_dsn: str) -> None:
    """watch_jobs replaces this session's watches and removes those of sessions gone;
    another live session's stay."""
    with connect(db_dsn, autocommit=True) as one, connect(db_dsn, autocommit=True) as two:
        one.execute(b"SELECT * FROM fleetq.watch_jobs(ARRAY[1, 2]::bigint[])")
        two.execute(b"SELECT * FROM fleetq.watch_jobs(ARRAY[2]::bigint[])")
        one.execute(b"SELECT * FROM fleetq.watch_jobs(ARRAY[3]::bigint[])")
        rows = sync_conn.execute(
            b"SELECT job_id, pid = $1 FROM fleetq.job_watchers ORDER BY 1",
            [one.info.backend_pid],
        ).fetchall()
        assert [tuple(r) for r in rows] == [(2, False), (3, True)]
    with connect(db_dsn, autocommit=True) as three:  # the others are gone now
        three.execute(b"SELECT * FROM fleetq.watch_jobs('{}'::bigint[])")
    assert sync_conn.execute(b"SELECT count(*) FROM fleetq.job_watchers").fetchone() == (0,)
    with pytest.raises(psycopg.Error, match="at most 1000"):
        sync_conn.execute(
            b"SELECT * FROM fleetq.watch_jobs(array(SELECT generate_series(1, 1001))::bigint[])"
        )
    sync_conn.rollback()
