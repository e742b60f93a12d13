"""Application retries: an operation that opts in has a failure it names tried again,
up to max_attempts in all, after a backoff; between attempts the job waits outside the
queue; the attempts are counted apart from losses and expiries; the last failure is the
verdict. A failed check is not retried unless the operation says so."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from fleetq.core import config, configview, leasing, producer, readers
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver
from fleetq.core.models import Claim, JobId, JobState, Outcome, OutcomeReport, RunnerId
from tests import fleet
from tests.fleet import SHA

POLICY = {
    "max_attempts": 3,
    "backoff_seconds": 10,
    "backoff_max_seconds": 15,
    "on": ["exception", "exit"],
    "exit_codes": [75],
}


@pytest.fixture(autouse=True)
def _fleet(sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)
    sync_conn.execute(
        "UPDATE fleetq.operations SET retry = $1::text::jsonb WHERE name = 'lint'",
        [json.dumps(POLICY)],
    )


async def _fail(driver: Driver, runner: RunnerId, claim: Claim, reason: str, code: int) -> None:
    report = OutcomeReport(
        job_id=claim.job_id,
        lease_version=claim.lease_version,
        outcome=Outcome.FAILED,
        exit_code=code,
        reason=reason,
    )
    await leasing.complete(driver, runner=runner, outcome=report)


async def _claimed(
    driver: Driver, project: str = "tools", operation: str = "lint"
) -> tuple[RunnerId, JobId, Claim]:
    """A runner, and a job of `operation` it has claimed."""
    runner = await fleet.runner(driver)
    answer = await producer.submit(
        driver, project=project, operation=operation, commit=SHA, submitted_by="a"
    )
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=5)
    return runner, answer.job_id, claim


def _due(conn: SyncConnection, job: JobId) -> None:
    """Time passes to the retry's due time: the reaper's leader queues it."""
    (at,) = conn.execute("SELECT retry_at FROM fleetq.jobs WHERE id = $1", [job]).fetchone() or ()
    conn.execute("SELECT * FROM fleetq.reap(1000, $1)", [at + timedelta(milliseconds=1)])


async def test_a_named_failure_is_retried_then_the_last_is_the_verdict(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    runner = await fleet.runner(driver)
    job = (
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
        )
    ).job_id
    tokens = []
    for attempt in (1, 2, 3):
        (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=5)
        tokens.append(claim.lease_version)
        await _fail(driver, runner, claim, "exception", 1)
        state = await readers.job(driver, job)
        if attempt < 3:
            assert (state.state, state.attempts) == (JobState.WAITING, attempt + 1)
            assert state.retry_at is not None and state.finished_at is None
            # backoff 10 s then 15 s (capped), jittered to between half and all of it
            (delay,) = (
                sync_conn.execute(
                    "SELECT extract(epoch FROM retry_at - updated_at)::float8 FROM fleetq.jobs "
                    "WHERE id = $1",
                    [job],
                ).fetchone()
                or ()
            )
            assert [5, 7.5][attempt - 1] - 0.1 <= delay <= [10, 15][attempt - 1] + 0.1
            assert await leasing.claim(driver, runner=runner, lane="checks", limit=5) == []
            _due(sync_conn, job)
    final = await readers.job(driver, job)
    assert (final.state, final.attempts, final.failure_reason) == (JobState.FAILED, 3, "exception")
    assert (final.lost_count, final.reassign_count) == (0, 0)  # budgets apart
    assert tokens == [1, 2, 3]
    kinds = [e.kind for e in await readers.events(driver, job_id=job)]
    assert kinds.count("failed_attempt") == 2 and kinds.count("failed") == 1
    assert kinds.count("retrying") == 2
    (verdict,) = (
        sync_conn.execute(
            "SELECT count(*) FROM fleetq.verdicts WHERE job_id = $1", [job]
        ).fetchone()
        or ()
    )
    assert verdict == 1  # one verdict, the last attempt's


async def test_an_attempt_that_is_retried_has_not_ended_its_job(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """Between attempts there is no verdict and no task notification, and a job
    submitted after this one keeps waiting: a failure that is retried is not an end."""
    runner = await fleet.runner(driver)
    job = (
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="a", task_id="t"
        )
    ).job_id
    after = await producer.submit(
        driver, project="tools", operation="lint", commit=SHA, submitted_by="a", after=[job]
    )
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=5)
    await _fail(driver, runner, claim, "exit", 75)
    assert (await readers.job(driver, job)).state == JobState.WAITING
    assert (await readers.job(driver, after.job_id)).state == JobState.WAITING
    # due after the backoff (10 s, jittered to between half and all of it), from now
    due_in = await leasing.next_retry_in(driver)
    assert due_in is not None and 4 < due_in <= 10, due_in
    ended = sync_conn.execute(
        "SELECT (SELECT count(*) FROM fleetq.verdicts WHERE job_id = $1), "
        "(SELECT count(*) FROM fleetq.task_notifications WHERE job_id = $1)",
        [job],
    ).fetchone()
    assert ended == (0, 0)


@pytest.mark.parametrize(("reason", "code"), [("exit", 1), ("timeout", 0)])
async def test_failures_the_policy_does_not_name_end_the_job(
    driver: Driver, reason: str, code: int
) -> None:
    runner, job, claim = await _claimed(driver)
    await _fail(driver, runner, claim, reason, code)  # exit 1 is not 75; timeout not named
    assert (await readers.job(driver, job)).state == JobState.FAILED


async def test_an_operation_without_a_policy_never_retries(driver: Driver) -> None:
    runner, job, claim = await _claimed(driver, "webapp", "unit")
    await _fail(driver, runner, claim, "exception", 1)
    assert (await readers.job(driver, job)).state == JobState.FAILED


async def test_a_job_waiting_to_retry_can_be_cancelled(driver: Driver) -> None:
    runner, job, claim = await _claimed(driver)
    await _fail(driver, runner, claim, "exit", 75)
    assert (await readers.job(driver, job)).state == JobState.WAITING
    result = await producer.cancel(driver, job_id=job, actor="ops")
    assert result.state == JobState.CANCELLED
    after = await readers.job(driver, job)
    assert (after.state, after.retry_at) == (JobState.CANCELLED, None)


def test_a_policy_is_configured_in_the_fleet_file(
    sync_conn: SyncConnection, tmp_path: Path
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[lanes.checks]\n\n[projects.tools]\nrepository = "/srv/git/tools.git"\n\n'
        '[projects.tools.operations.flaky]\nlane = "checks"\ncommand = "make flaky"\n'
        "retry = { max_attempts = 4, on = ['exit'], exit_codes = [75] }\n"
    )
    wanted = config.load(path)
    config.apply(sync_conn, wanted, source=path)
    (retry,) = (
        sync_conn.execute("SELECT retry FROM fleetq.operations WHERE name = 'flaky'").fetchone()
        or ()
    )
    assert (retry["max_attempts"], retry["on"], retry["exit_codes"]) == (4, ["exit"], [75])
    assert config.apply(sync_conn, wanted, source=path).changed["operations"] == 0
    assert configview.current(sync_conn).projects["tools"].operations["flaky"].retry == (
        wanted.projects["tools"].operations["flaky"].retry
    )
