"""Dependencies (`submit --after`): a job waits, outside the queue, until every job it
names has succeeded; one that fails, is refused or cancelled cancels it, naming that job,
and the cancellation carries on down a chain. Two dependencies ending at once, or a
dependency ending while the job that waits on it is being submitted, never leave it
waiting for ever."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from fleetq.core import eligibility, leasing, producer, queries, readers
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import Driver
from fleetq.core.errors import InvalidInput, NotAllowed
from fleetq.core.models import Claim, JobId, JobState, Outcome, OutcomeReport, RunnerId
from tests import fleet
from tests.fleet import SHA
from tests.locks import blocked_or_done, wait_for


@pytest.fixture(autouse=True)
def _fleet(sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)


async def _submit(driver: Driver, after: list[int] | None = None) -> JobId:
    answer = await producer.submit(
        driver, project="tools", operation="lint", commit=SHA, submitted_by="a", after=after
    )
    return answer.job_id


async def _run(driver: Driver, runner: RunnerId, job: JobId) -> Claim:
    claims = await leasing.claim(driver, runner=runner, lane="checks", limit=8)
    (claim,) = [c for c in claims if c.job_id == job]
    return claim


async def _finish(driver: Driver, runner: RunnerId, claim: Claim, outcome: Outcome) -> None:
    report = OutcomeReport(
        job_id=claim.job_id, lease_version=claim.lease_version, outcome=outcome, exit_code=0
    )
    await leasing.complete(driver, runner=runner, outcome=report)


async def test_a_job_waits_until_every_dependency_has_succeeded(driver: Driver) -> None:
    runner = await fleet.runner(driver)
    a, b = await _submit(driver), await _submit(driver)
    c = await _submit(driver, after=[a, b])
    job = await readers.job(driver, c)
    assert (job.state, job.waiting_on) == (JobState.WAITING, [a, b])
    claims = await leasing.claim(driver, runner=runner, lane="checks", limit=8)
    assert sorted(x.job_id for x in claims) == [a, b]  # the waiting job is not claimable
    by_id = {x.job_id: x for x in claims}
    await _finish(driver, runner, by_id[a], Outcome.SUCCEEDED)
    assert (await readers.job(driver, c)).waiting_on == [b]
    await _finish(driver, runner, by_id[b], Outcome.SUCCEEDED)
    assert (await readers.job(driver, c)).state == JobState.QUEUED
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=8)
    assert claim.job_id == c
    kinds = [e.kind for e in await readers.events(driver, job_id=c)]
    assert kinds[:2] == ["submitted", "ready"]


async def test_a_failed_dependency_cancels_the_chain_naming_it(driver: Driver) -> None:
    runner = await fleet.runner(driver)
    a = await _submit(driver)
    b = await _submit(driver, after=[a])
    c = await _submit(driver, after=[b])
    await _finish(driver, runner, await _run(driver, runner, a), Outcome.FAILED)
    jobs = {j: await readers.job(driver, j) for j in (b, c)}
    assert [jobs[j].state for j in (b, c)] == [JobState.CANCELLED, JobState.CANCELLED]
    assert jobs[b].cancel_reason == f"dependency failed: job {a} failed"
    assert jobs[c].cancel_reason == f"dependency failed: job {b} cancelled"
    assert not jobs[b].stop_pending  # nothing ran: nothing to stop


@pytest.mark.parametrize("end", ["cancelled", "refused"])
async def test_a_dependency_cancelled_or_refused_cancels_the_job(driver: Driver, end: str) -> None:
    runner = await fleet.runner(driver)
    a = await _submit(driver)
    b = await _submit(driver, after=[a])
    if end == "cancelled":
        await producer.cancel(driver, job_id=a, actor="ops")
    else:
        await _finish(driver, runner, await _run(driver, runner, a), Outcome.REFUSED)
    job = await readers.job(driver, b)
    assert (job.state, job.cancel_reason) == (
        JobState.CANCELLED,
        f"dependency failed: job {a} {end}",
    )


async def test_submitting_after_jobs_that_already_ended(driver: Driver) -> None:
    runner = await fleet.runner(driver)
    ok, bad = await _submit(driver), await _submit(driver)
    claims = {
        c.job_id: c for c in await leasing.claim(driver, runner=runner, lane="checks", limit=8)
    }
    await _finish(driver, runner, claims[ok], Outcome.SUCCEEDED)
    await _finish(driver, runner, claims[bad], Outcome.FAILED)
    assert (await readers.job(driver, await _submit(driver, after=[ok]))).state == JobState.QUEUED
    answer = await producer.submit(
        driver, project="tools", operation="lint", commit=SHA, submitted_by="a", after=[ok, bad]
    )
    assert answer.state == JobState.CANCELLED
    assert (await readers.job(driver, answer.job_id)).cancel_reason == (
        f"dependency failed: job {bad} failed"
    )


async def test_unknown_or_malformed_dependencies_are_refused(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    a = await _submit(driver)
    with pytest.raises(NotAllowed, match="no job 999999 to wait for"):
        await _submit(driver, after=[a, 999999])
    with pytest.raises(InvalidInput, match=r"whole numbers from 1 to 2\^63-1"):
        await _submit(driver, after=[0])
    (count,) = sync_conn.execute("SELECT count(*) FROM fleetq.jobs").fetchone() or ()
    assert count == 1  # nothing half made


async def test_explain_says_what_a_waiting_job_waits_on(driver: Driver) -> None:
    await fleet.runner(driver)
    a = await _submit(driver)
    b = await _submit(driver, after=[a])
    assert (await readers.job(driver, b)).waiting_on == [a]
    assert (await eligibility.explain(driver, b)).runners  # the rule still answers as for now


def _ended(conn: SyncConnection, runner: str, *claims: Claim) -> Callable[[], None]:
    """In a thread: complete `claims` (one batch) on `conn` and commit."""

    def end() -> None:
        _complete_sql(conn, runner, *claims)
        conn.commit()

    return end


def _complete_sql(conn: SyncConnection, runner: str, *claims: Claim) -> None:
    n = len(claims)
    conn.execute(
        queries.sql("lease_complete"),
        [
            runner,
            [c.job_id for c in claims],
            [c.lease_version for c in claims],
            ["succeeded"] * n,
            [0] * n,
            [None] * n,
            [""] * n,
            [None] * n,
            [None] * n,
            [None] * n,
            [None] * n,
        ],
    )


async def test_two_dependencies_ending_at_once_queue_the_job(driver: Driver, db_dsn: str) -> None:
    """Each ending transaction takes the waiting job's row before reading the others: the
    second waits for the first to commit, then sees it. Without that, each would see the
    other still running and the job would wait for ever."""
    # two runners: endings on one runner's row would serialize there anyway
    one = await fleet.runner(driver)
    other = await fleet.runner(driver, "r2", node="node-b")
    a, b = await _submit(driver), await _submit(driver)
    c = await _submit(driver, after=[a, b])
    (claim_a,) = await leasing.claim(driver, runner=one, lane="checks", limit=1)
    (claim_b,) = await leasing.claim(driver, runner=other, lane="checks", limit=1)
    assert (claim_a.job_id, claim_b.job_id) == (a, b)
    with connect(db_dsn) as first, connect(db_dsn) as second:
        _complete_sql(first, one, claim_a)  # not committed yet
        (pid,) = second.execute("SELECT pg_backend_pid()").fetchone() or ()
        done = threading.Thread(target=_ended(second, other, claim_b))
        done.start()
        wait_for(lambda: blocked_or_done(db_dsn, pid, done), "the second ending to wait")
        first.commit()
        done.join(timeout=10)
        assert not done.is_alive()
    assert (await readers.job(driver, c)).state == JobState.QUEUED


async def test_a_dependency_ending_during_the_submit_queues_the_job(
    driver: Driver, db_dsn: str, sync_conn: SyncConnection
) -> None:
    """The submit records its dependencies before it reads their states, and their foreign
    keys hold them (KEY SHARE) until it commits. Their ending does not wait for it (a
    submitter holding its transaction open held another tenant's outcome): it sees it
    cannot take its row FOR UPDATE, and the reaper's leader settles it again once the
    submit has committed, queueing the new job."""
    runner = await fleet.runner(driver)
    a, free = await _submit(driver), await _submit(driver)
    claim, other = sorted(
        await leasing.claim(driver, runner=runner, lane="checks", limit=8), key=lambda c: c.job_id
    )
    assert (claim.job_id, other.job_id) == (a, free)
    with connect(db_dsn) as submitter, connect(db_dsn) as ender:
        (row,) = submitter.execute(
            queries.sql("jobs_submit"),
            ["tools", "lint", SHA, None, None, None, "a", "{}", [a], None],
        ).fetchall()
        ender.execute(b"SET lock_timeout = '5s'")
        _ended(ender, runner, claim, other)()  # does not wait for the submit
        again = sync_conn.execute(b"SELECT job_id FROM fleetq.settle_again").fetchall()
        assert again == [(a,)]
        submitter.commit()
    waiting = JobId(row[0])
    assert (await readers.job(driver, waiting)).state == JobState.WAITING  # it read a running
    sync_conn.execute(b"SELECT * FROM fleetq.reap(1000, NULL)")
    assert (await readers.job(driver, waiting)).state == JobState.QUEUED
    assert sync_conn.execute(b"SELECT count(*) FROM fleetq.settle_again").fetchone() == (0,)


async def test_an_ending_nothing_holds_is_settled_at_once(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    runner = await fleet.runner(driver)
    a = await _submit(driver)
    b = await _submit(driver, after=[a])
    await _finish(driver, runner, await _run(driver, runner, a), Outcome.SUCCEEDED)
    assert (await readers.job(driver, b)).state == JobState.QUEUED
    assert sync_conn.execute(b"SELECT count(*) FROM fleetq.settle_again").fetchone() == (0,)


async def test_a_job_named_by_a_submit_in_flight_is_still_claimed(
    driver: Driver, db_dsn: str
) -> None:
    """A `submit --after` holds each job it names (its foreign key's KEY SHARE) until it
    commits. A claim meanwhile must take such a job all the same: before, the claim held
    its jobs FOR UPDATE, which a key share blocks, so it skipped the job, and nothing
    announced the job again once the submit committed (it waited for a poll)."""
    runner = await fleet.runner(driver)
    a = await _submit(driver)
    with connect(db_dsn) as submitter:
        submitter.execute(
            queries.sql("jobs_submit"),
            ["tools", "lint", SHA, None, None, None, "a", "{}", [a], None],
        ).fetchall()
        claims = await leasing.claim(driver, runner=runner, lane="checks", limit=8)
        assert [c.job_id for c in claims] == [a]
        submitter.commit()
