"""The lease protocol against a real database: claim, fenced writes, expiry, loss,
cancel, and what a zombie can (not) do."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from fleetq.core import eligibility, leasing, producer, queries, readers, stats, views
from fleetq.core import fleet as fleet_api
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver
from fleetq.core.errors import ConnectionFailed, InvalidInput, NotAllowed, NotFound, StaleLease
from fleetq.core.models import (
    Claim,
    FencingToken,
    JobId,
    JobState,
    Outcome,
    OutcomeReport,
    RunnerId,
    RunnerState,
    WriteStatus,
)
from tests import fleet
from tests.fleet import SHA, start_report
from tests.locks import blocked_or_done, wait_for

FUTURE = datetime.now(UTC) + timedelta(days=1)


@pytest.fixture(autouse=True)
def _fleet(sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)


async def _job(
    driver: Driver,
    operation: str = "lint",
    project: str = "tools",
    *,
    who: str = "alice",
    task_id: str | None = None,
    requested_node: str | None = None,
) -> JobId:
    answer = await producer.submit(
        driver,
        project=project,
        operation=operation,
        commit=SHA,
        submitted_by=who,
        task_id=task_id,
        requested_node=requested_node,
    )
    return answer.job_id


async def _claim_one(driver: Driver, runner: RunnerId, lane: str = "checks") -> Claim:
    (claim,) = await leasing.claim(driver, runner=runner, lane=lane, limit=1)
    return claim


def _outcome(claim: Claim, outcome: Outcome = Outcome.SUCCEEDED, code: int = 0) -> OutcomeReport:
    return OutcomeReport(
        job_id=claim.job_id,
        lease_version=claim.lease_version,
        outcome=outcome,
        exit_code=code,
        log_tail="ok\n",
        prepare_ms=5,
        run_ms=10,
    )


async def _reserved(driver: Driver, runner: RunnerId) -> tuple[int, int, dict[str, list[int]]]:
    (r,) = [r for r in await fleet_api.runners(driver) if r.id == runner]
    return r.reserved_memory_mb, r.reserved_cpu_millis, r.lanes


async def test_claim_bumps_the_token_and_reserves_capacity(driver: Driver) -> None:
    runner = await fleet.runner(driver)
    job_id = await _job(driver)
    claim = await _claim_one(driver, runner)
    assert (claim.job_id, claim.lease_version) == (job_id, 1)
    job = await readers.job(driver, job_id)
    assert (job.state, job.lease_owner, job.reserved_on) == (JobState.CLAIMED, runner, runner)
    assert await _reserved(driver, runner) == (256, 500, {"checks": [4, 1], "control": [1, 0]})


@pytest.mark.parametrize(("memory", "cpu"), [(256, 0), (0, 500), (0, 0)])
async def test_a_claim_reserves_and_its_outcome_gives_back_exactly_what_its_job_needs(
    driver: Driver, sync_conn: SyncConnection, memory: int, cpu: int
) -> None:
    """Either resource alone, or neither (a claim and an outcome that reserve nothing skip
    the runner's row: that shortcut must not drop a reservation of one resource)."""
    sync_conn.execute(
        "UPDATE fleetq.operations SET memory_mb = $1, cpu_millis = $2 "
        "WHERE project = 'tools' AND name = 'lint'",
        [memory, cpu],
    )
    runner = await fleet.runner(driver)
    await _job(driver)
    claim = await _claim_one(driver, runner)
    assert (await _reserved(driver, runner))[:2] == (memory, cpu)
    assert await leasing.complete(driver, runner=runner, outcome=_outcome(claim)) == WriteStatus.OK
    assert (await _reserved(driver, runner))[:2] == (0, 0)


async def test_lease_expiry_is_database_time(driver: Driver, sync_conn: SyncConnection) -> None:
    sync_conn.execute("UPDATE fleetq.settings SET value = '45' WHERE name = 'lease_seconds'")
    runner = await fleet.runner(driver)
    await _job(driver)
    claim = await _claim_one(driver, runner)
    row = sync_conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    remaining = (claim.lease_expires_at - row[0]).total_seconds()
    assert 40 < remaining <= 45


async def test_each_lease_answers_its_own_length_and_a_start_never_shortens_it(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """A runner renews and fences each lease by what the database granted it (issue 42):
    the claim and each renewal say how long the lease has left, on the database's clock,
    whatever the lease setting was when the runner read it. A start report sent after
    the setting was lowered leaves the claim's longer lease alone (it answers no length);
    the next renewal grants the new one and says so."""
    sync_conn.execute("UPDATE fleetq.settings SET value = '30' WHERE name = 'lease_seconds'")
    runner = await fleet.runner(driver)
    await _job(driver)
    claim = await _claim_one(driver, runner)
    assert claim.lease_left_s is not None and 25 < claim.lease_left_s <= 30
    sync_conn.execute("UPDATE fleetq.settings SET value = '5' WHERE name = 'lease_seconds'")
    assert (
        await leasing.report_start(driver, runner=runner, start=start_report(claim))
        == WriteStatus.OK
    )
    (row,) = sync_conn.execute(
        "SELECT lease_expires_at FROM fleetq.jobs WHERE id = $1", [claim.job_id]
    ).fetchall()
    assert row[0] == claim.lease_expires_at  # not cut to five seconds from the start
    (beat,) = await leasing.heartbeat(
        driver, runner=runner, leases=[(claim.job_id, claim.lease_version)]
    )
    assert beat.status == WriteStatus.OK
    assert beat.lease_left_s is not None and 0 < beat.lease_left_s <= 5
    sync_conn.execute("UPDATE fleetq.settings SET value = '40' WHERE name = 'lease_seconds'")
    (beat,) = await leasing.heartbeat(
        driver, runner=runner, leases=[(claim.job_id, claim.lease_version)]
    )
    assert beat.lease_left_s is not None and 35 < beat.lease_left_s <= 40
    stale = await leasing.heartbeat(
        driver, runner=runner, leases=[(claim.job_id, FencingToken(claim.lease_version + 1))]
    )
    assert [(b.status, b.lease_left_s) for b in stale] == [(WriteStatus.STALE, None)]


async def test_an_outcome_under_a_token_not_yet_granted_is_stale(driver: Driver) -> None:
    """Only the current token writes: not an older one, and not one greater than any
    granted (mutant an-outcome-under-a-greater-token, issue 43, finding 3)."""
    runner = await fleet.runner(driver)
    await _job(driver)
    claim = await _claim_one(driver, runner)
    ahead = OutcomeReport(
        job_id=claim.job_id,
        lease_version=FencingToken(claim.lease_version + 1),
        outcome=Outcome.SUCCEEDED,
    )
    with pytest.raises(StaleLease):
        await leasing.complete(driver, runner=runner, outcome=ahead)
    job = await readers.job(driver, claim.job_id)
    assert (job.state, job.lease_version) == (JobState.CLAIMED, claim.lease_version)


async def test_empty_queue_and_unknown_runner(driver: Driver) -> None:
    runner = await fleet.runner(driver)
    assert await leasing.claim(driver, runner=runner, lane="checks", limit=5) == []
    with pytest.raises(NotFound, match="unknown runner"):
        await leasing.claim(driver, runner=RunnerId("no/such"), lane="checks", limit=1)
    with pytest.raises(InvalidInput):
        await leasing.claim(driver, runner=runner, lane="checks", limit=0)


async def test_full_life_start_heartbeat_complete(driver: Driver) -> None:
    runner = await fleet.runner(driver)
    job_id = await _job(driver, task_id="task-9")
    claim = await _claim_one(driver, runner)
    assert (
        await leasing.report_start(driver, runner=runner, start=start_report(claim))
        == WriteStatus.OK
    )
    (beat,) = await leasing.heartbeat(
        driver, runner=runner, leases=[(claim.job_id, claim.lease_version)]
    )
    assert beat.status == WriteStatus.OK and beat.lease_expires_at is not None
    assert beat.lease_expires_at >= claim.lease_expires_at
    status = await leasing.complete(driver, runner=runner, outcome=_outcome(claim))
    assert status == WriteStatus.OK
    job = await readers.job(driver, job_id)
    assert (job.state, job.lease_owner, job.reserved_on) == (JobState.SUCCEEDED, None, None)
    assert await _reserved(driver, runner) == (0, 0, {"checks": [4, 0], "control": [1, 0]})
    (answer,) = await readers.result(driver, project="tools", commit=SHA)
    assert (answer.status, answer.job_id, answer.exit_code) == ("passed", job_id, 0)
    kinds = [e.kind for e in await readers.events(driver, job_id=job_id)]
    assert kinds == ["submitted", "claimed", "started", "succeeded"]


async def test_task_notification_is_written_with_the_outcome(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    runner = await fleet.runner(driver)
    job_id = await _job(driver, task_id="T-1")
    claim = await _claim_one(driver, runner)
    await leasing.complete(driver, runner=runner, outcome=_outcome(claim, Outcome.FAILED, 3))
    rows = sync_conn.execute(
        "SELECT task_id, job_id, state, verdict FROM fleetq.task_notifications"
    ).fetchall()
    assert rows == [("T-1", job_id, "failed", "failed")]


async def _zombie_and_successor(driver: Driver) -> tuple[RunnerId, Claim, RunnerId, Claim]:
    """Runner A claims, its lease expires, runner B claims the job again."""
    a = await fleet.runner(driver, "a")
    b = await fleet.runner(driver, "b", node="node-b")
    await _job(driver)
    old = await _claim_one(driver, a)
    await leasing.report_start(driver, runner=a, start=start_report(old))
    reaped = await leasing.reap(driver, now=FUTURE)
    assert (reaped.requeued, reaped.leader) == (1, True)
    new = await _claim_one(driver, b)
    assert new.lease_version == old.lease_version + 1
    return a, old, b, new


async def test_zombie_writes_change_nothing_and_raise(driver: Driver) -> None:
    a, old, b, new = await _zombie_and_successor(driver)
    before = await readers.job(driver, old.job_id)
    with pytest.raises(StaleLease, match="fencing token 1"):
        await leasing.report_start(driver, runner=a, start=start_report(old))
    (beat,) = await leasing.heartbeat(driver, runner=a, leases=[(old.job_id, old.lease_version)])
    assert beat.status == WriteStatus.STALE
    with pytest.raises(StaleLease):
        await leasing.complete(driver, runner=a, outcome=_outcome(old))
    with pytest.raises(StaleLease):
        await leasing.complete(driver, runner=a, outcome=_outcome(old, Outcome.FAILED, 1))
    with pytest.raises(StaleLease):
        await leasing.report_lost(
            driver, runner=a, job_id=old.job_id, token=old.lease_version, reason="zombie"
        )
    assert await readers.job(driver, old.job_id) == before
    # the new owner's outcome stands
    await leasing.report_start(driver, runner=b, start=start_report(new, "node-b"))
    assert await leasing.complete(driver, runner=b, outcome=_outcome(new)) == WriteStatus.OK
    assert (await readers.job(driver, new.job_id)).state == JobState.SUCCEEDED
    runners = {r.id: r for r in await fleet_api.runners(driver)}
    assert runners[a].stale_rejections == 5
    assert runners[b].stale_rejections == 0


async def test_even_the_same_runner_with_an_old_token_is_stale(driver: Driver) -> None:
    a = await fleet.runner(driver)
    await _job(driver)
    old = await _claim_one(driver, a)
    await leasing.reap(driver, now=FUTURE)
    new = await _claim_one(driver, a)
    with pytest.raises(StaleLease):
        await leasing.complete(driver, runner=a, outcome=_outcome(old))
    assert await leasing.complete(driver, runner=a, outcome=_outcome(new)) == WriteStatus.OK


async def test_the_same_runner_s_old_token_neither_renews_nor_starts(driver: Driver) -> None:
    """The token names the execution: a's superseded run (token 1) cannot renew or mark
    running a's new claim of the same job (token 2). The owner alone would let it."""
    a = await fleet.runner(driver)
    job_id = await _job(driver)
    old = await _claim_one(driver, a)
    await leasing.reap(driver, now=FUTURE)
    new = await _claim_one(driver, a)
    before = await readers.job(driver, job_id)
    (beat,) = await leasing.heartbeat(driver, runner=a, leases=[(job_id, old.lease_version)])
    assert beat.status == WriteStatus.STALE
    with pytest.raises(StaleLease):
        await leasing.report_start(driver, runner=a, start=start_report(old))
    after = await readers.job(driver, job_id)
    assert (after.state, after.lease_expires_at) == (JobState.CLAIMED, before.lease_expires_at)
    (beat,) = await leasing.heartbeat(driver, runner=a, leases=[(job_id, new.lease_version)])
    assert beat.status == WriteStatus.OK


async def test_another_runner_with_the_current_token_cannot_renew_or_finish(
    driver: Driver,
) -> None:
    """Only the holder writes: b presenting a's current token keeps nothing alive and
    finishes nothing."""
    a = await fleet.runner(driver)
    b = await fleet.runner(driver, "b", node="node-b")
    job_id = await _job(driver)
    claim = await _claim_one(driver, a)
    before = await readers.job(driver, job_id)
    (beat,) = await leasing.heartbeat(driver, runner=b, leases=[(job_id, claim.lease_version)])
    assert beat.status == WriteStatus.STALE
    with pytest.raises(StaleLease):
        await leasing.complete(driver, runner=b, outcome=_outcome(claim))
    assert await readers.job(driver, job_id) == before


async def test_outcome_retried_after_a_lost_reply_answers_already(
    db_dsn: str, driver: Driver
) -> None:
    runner = await fleet.runner(driver)
    await _job(driver)
    claim = await _claim_one(driver, runner)
    await leasing.complete(driver, runner=runner, outcome=_outcome(claim))  # reply "lost"
    from fleetq.core.driver import open_driver

    async with open_driver(db_dsn) as fresh:  # the retry comes on a new connection
        status = await leasing.complete(fresh, runner=runner, outcome=_outcome(claim))
    assert status == WriteStatus.ALREADY
    events = [e.kind for e in await readers.events(driver, job_id=claim.job_id)]
    assert events.count("succeeded") == 1


async def test_retried_claim_id_returns_what_it_took(driver: Driver) -> None:
    runner = await fleet.runner(driver)
    for _ in range(3):
        await _job(driver)
    claim_id = uuid.uuid4()
    first = await leasing.claim(driver, runner=runner, lane="checks", limit=2, claim_id=claim_id)
    again = await leasing.claim(driver, runner=runner, lane="checks", limit=2, claim_id=claim_id)
    assert [c.job_id for c in again] == [c.job_id for c in first] and len(first) == 2
    assert [c.lease_version for c in again] == [1, 1]


async def test_retried_start_report_answers_already(driver: Driver) -> None:
    runner = await fleet.runner(driver)
    await _job(driver)
    claim = await _claim_one(driver, runner)
    start = start_report(claim)
    assert await leasing.report_start(driver, runner=runner, start=start) == WriteStatus.OK
    assert await leasing.report_start(driver, runner=runner, start=start) == WriteStatus.ALREADY


async def test_heartbeat_batch_reports_each_job(driver: Driver) -> None:
    runner = await fleet.runner(driver)
    for _ in range(3):
        await _job(driver)
    claims = await leasing.claim(driver, runner=runner, lane="checks", limit=3)
    await producer.cancel(driver, job_id=claims[1].job_id, actor="ops")
    beats = await leasing.heartbeat(
        driver, runner=runner, leases=[(c.job_id, c.lease_version) for c in claims]
    )
    assert [b.status for b in beats] == [WriteStatus.OK, WriteStatus.STALE, WriteStatus.OK]
    with pytest.raises(InvalidInput, match="same job twice"):
        await leasing.heartbeat(
            driver, runner=runner, leases=[(claims[0].job_id, FencingToken(1))] * 2
        )


async def test_complete_batch_mixes_ok_already_and_stale(driver: Driver) -> None:
    runner = await fleet.runner(driver)
    for _ in range(3):
        await _job(driver)
    c1, c2, c3 = await leasing.claim(driver, runner=runner, lane="checks", limit=3)
    await leasing.complete(driver, runner=runner, outcome=_outcome(c1))
    await producer.cancel(driver, job_id=c3.job_id, actor="ops")
    answers = await leasing.complete_many(
        driver, runner=runner, outcomes=[_outcome(c1), _outcome(c2), _outcome(c3)]
    )
    assert [a.status for a in answers] == [WriteStatus.ALREADY, WriteStatus.OK, WriteStatus.STALE]


async def test_lost_once_requeues_twice_fails(driver: Driver) -> None:
    runner = await fleet.runner(driver)
    job_id = await _job(driver)
    first = await _claim_one(driver, runner)
    assert (
        await leasing.report_lost(
            driver,
            runner=runner,
            job_id=job_id,
            token=first.lease_version,
            reason="launched nothing",
        )
        == "requeued"
    )
    job = await readers.job(driver, job_id)
    assert (job.state, job.lost_count, job.reserved_on) == (JobState.QUEUED, 1, None)
    assert (
        await leasing.report_lost(
            driver, runner=runner, job_id=job_id, token=first.lease_version, reason="retry"
        )
        == "already"
    )
    second = await _claim_one(driver, runner)
    assert second.lease_version == 2 and second.lost_count == 1
    assert (
        await leasing.report_lost(
            driver, runner=runner, job_id=job_id, token=second.lease_version, reason="gone"
        )
        == "failed"
    )
    job = await readers.job(driver, job_id)
    assert (job.state, job.failure_reason, job.lost_count) == (JobState.FAILED, "lost", 2)
    assert await _reserved(driver, runner) == (0, 0, {"checks": [4, 0], "control": [1, 0]})


async def test_expiry_never_counts_as_loss_and_has_its_own_cap(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    sync_conn.execute("UPDATE fleetq.settings SET value = '2' WHERE name = 'reassignment_cap'")
    runner = await fleet.runner(driver)
    job_id = await _job(driver)
    for expected in (1, 2):
        await _claim_one(driver, runner)
        assert (await leasing.reap(driver, now=FUTURE)).requeued == 1
        job = await readers.job(driver, job_id)
        assert (job.state, job.reassign_count, job.lost_count) == (JobState.QUEUED, expected, 0)
    await _claim_one(driver, runner)
    reaped = await leasing.reap(driver, now=FUTURE)
    assert (reaped.requeued, reaped.failed) == (0, 1)
    job = await readers.job(driver, job_id)
    assert (job.state, job.failure_reason) == (JobState.FAILED, "reassignments_exhausted")
    assert job.lost_count == 0
    assert await _reserved(driver, runner) == (0, 0, {"checks": [4, 0], "control": [1, 0]})


async def test_reap_leaves_live_leases_alone(driver: Driver, sync_conn: SyncConnection) -> None:
    runner = await fleet.runner(driver)
    job_id = await _job(driver)
    await _claim_one(driver, runner)
    assert (await leasing.reap(driver)).requeued == 0
    # even one about to expire (mutant reaper-takes-leases-about-to-expire: a lease with
    # 0.80 s left was requeued)
    sync_conn.execute(
        "UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() + interval '0.8 s' "
        "WHERE id = $1",
        [job_id],
    )
    assert (await leasing.reap(driver)).requeued == 0


async def test_cancel_of_a_running_job_is_terminal_with_stop_pending(driver: Driver) -> None:
    runner = await fleet.runner(driver)
    job_id = await _job(driver)
    claim = await _claim_one(driver, runner)
    await leasing.report_start(driver, runner=runner, start=start_report(claim))
    result = await producer.cancel(driver, job_id=job_id, actor="ops", reason="wrong commit")
    assert (result.state, result.stop_pending) == (JobState.CANCELLED, True)
    job = await readers.job(driver, job_id)
    assert job.stop_pending and job.finished_at is not None
    # the running execution is asked to stop (what the runner and the timeline read)
    (execution,) = (await views.job_detail(driver, job_id)).executions
    assert execution.stop_requested_at is not None and execution.ended_at is None
    with pytest.raises(StaleLease):
        await leasing.complete(driver, runner=runner, outcome=_outcome(claim))
    # capacity stays reserved until the runner confirms the process is gone
    assert (await _reserved(driver, runner))[0] == 256
    await leasing.confirm_stop(
        driver,
        runner=runner,
        job_id=job_id,
        token=claim.lease_version,
        signal=15,
        reason="cancelled",
    )
    job = await readers.job(driver, job_id)
    assert not job.stop_pending
    assert await _reserved(driver, runner) == (0, 0, {"checks": [4, 0], "control": [1, 0]})
    assert (await readers.job(driver, job_id)).state == JobState.CANCELLED


async def test_a_stop_says_cancelled_only_when_a_cancel_ended_that_very_lease(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """A runner that finds its lease gone says cancelled or superseded from the job's state
    as it sees it now; the database records which ended the lease. A cancel did when the
    job was cancelled under that lease (its room still reserved); a lease that expired, or
    moved to another runner, before a cancel was superseded. A retried confirmation keeps
    the first one's reason, and the event says what the execution says."""
    a = await fleet.runner(driver)
    b = await fleet.runner(driver, "r2")

    def recorded(claim: Claim) -> tuple[object, object]:
        row = sync_conn.execute(
            "SELECT x.stop_reason, (SELECT e.detail->>'reason' FROM fleetq.events e "
            "WHERE e.job_id = x.job_id AND e.kind = 'stopped' ORDER BY e.id DESC LIMIT 1) "
            "FROM fleetq.executions x WHERE x.job_id = $1 AND x.lease_version = $2",
            [claim.job_id, claim.lease_version],
        ).fetchone()
        assert row is not None
        return row[0], row[1]

    async def cancel(claim: Claim) -> None:
        await producer.cancel(driver, job_id=claim.job_id, actor="ops", reason="not needed")

    async def confirm(claim: Claim, reason: str) -> None:
        await leasing.confirm_stop(
            driver,
            runner=a,
            job_id=claim.job_id,
            token=claim.lease_version,
            signal=None,
            reason=reason,
        )

    cancelled = await _started(driver, a)  # cancelled under a's lease
    await cancel(cancelled)
    moved, moved_too = await _started(driver, a), await _started(driver, a)
    for claim in (moved, moved_too):  # expired, claimed by b, then cancelled
        await _expire(driver, sync_conn, claim)
    assert {c.job_id for c in await leasing.claim(driver, runner=b, lane="checks", limit=2)} == {
        moved.job_id,
        moved_too.job_id,
    }
    await cancel(moved)
    await cancel(moved_too)
    expired = await _started(driver, a)  # expired, then cancelled while queued
    await _expire(driver, sync_conn, expired)
    await cancel(expired)

    await confirm(cancelled, "superseded")
    await confirm(cancelled, "superseded")  # a retry: the reservation is gone by now
    await confirm(moved, "superseded")
    await confirm(moved_too, "cancelled")  # the runner read the job's state: cancelled
    await confirm(expired, "superseded")
    assert [recorded(c) for c in (cancelled, moved, moved_too, expired)] == [
        ("cancelled", "cancelled"),
        ("superseded", "superseded"),
        ("superseded", "superseded"),
        ("superseded", "superseded"),
    ]


async def test_priority_order_across_and_inside_classes(driver: Driver) -> None:
    runner = await fleet.runner(driver, lanes={"checks": 10})
    plain_1 = await _job(driver)
    gate_1 = await _job(driver, "unit", "webapp")
    plain_2 = await _job(driver)
    release = await _job(driver, who="release-bot")
    gate_2 = await _job(driver, "unit", "webapp")
    claims = await leasing.claim(driver, runner=runner, lane="checks", limit=10)
    assert [c.job_id for c in claims] == [release, gate_1, gate_2, plain_1, plain_2]
    assert [c.priority_class for c in claims] == [0, 1, 1, 2, 2]


async def test_runner_never_gets_what_it_cannot_run(driver: Driver) -> None:
    small = await fleet.runner(driver, "small", memory_mb=2048, cpu_millis=4000)
    browser_job = await _job(driver, "browser", "webapp")
    pinned = await _job(driver, requested_node="node-z")
    assert await leasing.claim(driver, runner=small, lane="checks", limit=5) == []
    big = await fleet.runner(driver, "big", capabilities=("browser",), node="node-z")
    got = await leasing.claim(driver, runner=big, lane="checks", limit=5)
    assert sorted(c.job_id for c in got) == sorted([browser_job, pinned])


async def test_a_job_needing_more_cpu_than_is_free_waits(driver: Driver) -> None:
    """Every dimension is checked before the claim: memory to spare is not enough."""
    runner = await fleet.runner(driver, memory_mb=100_000, cpu_millis=500)
    job_id = await _job(driver, "unit", "webapp")  # 1000 millis
    assert await leasing.claim(driver, runner=runner, lane="checks", limit=5) == []
    assert (await readers.job(driver, job_id)).state == JobState.QUEUED
    (verdict,) = (await eligibility.explain(driver, job_id)).runners  # and explain says why
    assert verdict.reason == "cpu"


async def test_batch_takes_only_the_prefix_that_fits_together(driver: Driver) -> None:
    runner = await fleet.runner(driver, memory_mb=2500, cpu_millis=10000, lanes={"checks": 8})
    ids = [await _job(driver, "unit", "webapp") for _ in range(3)]  # 1024 MB each
    claims = await leasing.claim(driver, runner=runner, lane="checks", limit=8)
    assert [c.job_id for c in claims] == ids[:2]
    assert (await _reserved(driver, runner))[0] == 2048


async def test_batch_fits_cpu_together_too(driver: Driver) -> None:
    """Each job fits alone; the batch keeps the prefix whose CPU total fits as well."""
    runner = await fleet.runner(driver, memory_mb=100_000, cpu_millis=2500, lanes={"checks": 8})
    ids = [await _job(driver, "unit", "webapp") for _ in range(3)]  # 1000 millis each
    claims = await leasing.claim(driver, runner=runner, lane="checks", limit=8)
    assert [c.job_id for c in claims] == ids[:2]
    assert (await _reserved(driver, runner))[1] == 2000


async def test_slots_bound_the_batch(driver: Driver) -> None:
    runner = await fleet.runner(driver, lanes={"checks": 2})
    for _ in range(4):
        await _job(driver)
    assert len(await leasing.claim(driver, runner=runner, lane="checks", limit=10)) == 2
    assert await leasing.claim(driver, runner=runner, lane="checks", limit=10) == []


async def test_lanes_are_separate(driver: Driver) -> None:
    runner = await fleet.runner(driver, lanes={"checks": 1, "control": 1})
    await _job(driver)
    await _job(driver)
    notify = await _job(driver, "notify", "webapp")
    await _claim_one(driver, runner)  # checks is now full
    (control,) = await leasing.claim(driver, runner=runner, lane="control", limit=5)
    assert control.job_id == notify


@pytest.mark.parametrize("state", [RunnerState.DRAINING, RunnerState.PAUSED])
async def test_paused_and_draining_runners_claim_nothing(
    driver: Driver, state: RunnerState
) -> None:
    runner = await fleet.runner(driver)
    await _job(driver)
    held = await _claim_one(driver, runner)
    await _job(driver)
    written = await fleet_api.set_state(
        driver, runner=runner, state=state, reason="maintenance", actor="ops"
    )
    assert written == state
    assert await leasing.claim(driver, runner=runner, lane="checks", limit=5) == []
    await leasing.complete(driver, runner=runner, outcome=_outcome(held))
    await leasing.heartbeat(driver, runner=runner, leases=[])
    (r,) = await fleet_api.runners(driver)
    assert r.state == (RunnerState.DRAINED if state == RunnerState.DRAINING else state)
    await fleet_api.set_state(
        driver, runner=runner, state=RunnerState.ACTIVE, reason="", actor="ops"
    )
    assert len(await leasing.claim(driver, runner=runner, lane="checks", limit=5)) == 1


async def test_stale_heartbeat_makes_a_runner_offline_and_ineligible(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    runner = await fleet.runner(driver)
    await _job(driver)
    sync_conn.execute(
        "UPDATE fleetq.runners SET last_heartbeat_at = clock_timestamp() - interval '1 hour'"
    )
    (r,) = await fleet_api.runners(driver)
    assert r.offline and r.state == RunnerState.ACTIVE
    assert await leasing.claim(driver, runner=runner, lane="checks", limit=1) == []
    await leasing.heartbeat(driver, runner=runner, leases=[])
    assert len(await leasing.claim(driver, runner=runner, lane="checks", limit=1)) == 1


async def test_reregistering_recomputes_reservations(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    runner = await fleet.runner(driver)
    await _job(driver)
    await _claim_one(driver, runner)
    sync_conn.execute("UPDATE fleetq.runners SET reserved_memory_mb = 0")  # drift
    await fleet.runner(driver)
    assert (await _reserved(driver, runner))[0] == 256


async def test_result_reader_says_live_then_verdict(driver: Driver) -> None:
    runner = await fleet.runner(driver)
    await _job(driver)
    (live,) = await readers.result(driver, project="tools", commit=SHA)
    assert (live.status, live.job_state) == ("live", JobState.QUEUED)
    claim = await _claim_one(driver, runner)
    await leasing.complete(driver, runner=runner, outcome=_outcome(claim, Outcome.FAILED, 2))
    (done,) = await readers.result(driver, project="tools", commit=SHA)
    assert (done.status, done.exit_code) == ("failed", 2)
    # an operation the project does not have can never be answered: not "none" (not yet)
    with pytest.raises(NotAllowed, match="has no operation 'other'"):
        await readers.result(driver, project="tools", commit=SHA, operation="other")


async def test_refused_outcome(driver: Driver) -> None:
    runner = await fleet.runner(driver)
    await _job(driver)
    claim = await _claim_one(driver, runner)
    report = OutcomeReport(
        job_id=claim.job_id,
        lease_version=claim.lease_version,
        outcome=Outcome.REFUSED,
        reason="unknown commit",
    )
    await leasing.complete(driver, runner=runner, outcome=report)
    (answer,) = await readers.result(driver, project="tools", commit=SHA)
    assert (answer.status, answer.reason) == ("refused", "unknown commit")


async def test_fenced_ledger_rejects_older_tokens(driver: Driver) -> None:
    job = JobId(1)
    assert await leasing.fenced_write(
        driver, key="k", job_id=job, token=FencingToken(2), value={"v": 2}
    )
    assert await leasing.fenced_write(
        driver, key="k", job_id=job, token=FencingToken(2), value={"v": 3}
    )
    assert not await leasing.fenced_write(
        driver, key="k", job_id=job, token=FencingToken(1), value={"v": 1}
    )
    assert await leasing.fenced_write(
        driver, key="other", job_id=job, token=FencingToken(1), value={}
    )
    assert await leasing.fenced_violations(driver) == 0


async def test_fenced_violation_counter_can_count(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """The counter the fault tests rely on does count a violation when one is recorded."""
    sync_conn.execute(
        "INSERT INTO fleetq.fenced_writes (key, job_id, token, accepted) "
        "VALUES ('k', 1, 5, true), ('k', 1, 3, true)"
    )
    assert await leasing.fenced_violations(driver) == 1


async def test_release_requeues_without_counting(driver: Driver) -> None:
    runner = await fleet.runner(driver)
    job_id = await _job(driver)
    claim = await _claim_one(driver, runner)
    status = await leasing.release(
        driver, runner=runner, job_id=job_id, token=claim.lease_version, reason="shutdown"
    )
    assert status == WriteStatus.OK
    job = await readers.job(driver, job_id)
    assert (job.state, job.lost_count, job.reassign_count) == (JobState.QUEUED, 0, 0)
    assert await _reserved(driver, runner) == (0, 0, {"checks": [4, 0], "control": [1, 0]})
    assert (
        await leasing.release(
            driver, runner=runner, job_id=job_id, token=claim.lease_version, reason="retry"
        )
        == WriteStatus.ALREADY
    )
    again = await _claim_one(driver, runner)
    assert again.lease_version == claim.lease_version + 1
    with pytest.raises(StaleLease):
        await leasing.release(
            driver, runner=runner, job_id=job_id, token=claim.lease_version, reason="zombie"
        )


async def test_hand_backs_after_a_self_fence_count_toward_the_cap(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """A job that makes every runner fence itself cannot cycle forever: each fenced
    hand-back counts a reassignment, and past the cap the job fails."""
    sync_conn.execute("UPDATE fleetq.settings SET value = '1' WHERE name = 'reassignment_cap'")
    runner = await fleet.runner(driver)
    job_id = await _job(driver)
    answers = []
    for _ in range(2):
        claim = await _claim_one(driver, runner)
        answers.append(
            await leasing.release(
                driver,
                runner=runner,
                job_id=job_id,
                token=claim.lease_version,
                reason="self-fenced",
                fenced=True,
            )
        )
    assert answers == [WriteStatus.OK, "failed"]
    job = await readers.job(driver, job_id)
    assert (job.state, job.failure_reason, job.reassign_count) == (
        JobState.FAILED,
        "reassignments_exhausted",
        2,
    )


async def test_a_runner_for_an_unknown_lane_is_refused_clearly(driver: Driver) -> None:
    from fleetq.core.errors import NotAllowed

    with pytest.raises(
        NotAllowed, match=r"unknown lane\(s\) gpu-jobs; registered: checks, control"
    ):
        await fleet.runner(driver, lanes={"checks": 1, "gpu-jobs": 2})


async def test_launch_time_is_clamped_between_claim_and_start_report(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """A node's process start time (whole-second boot time underneath) cannot put a
    launch before the claim that led to it: overlap windows stay on database time."""
    runner = await fleet.runner(driver)
    await _job(driver)
    claim = await _claim_one(driver, runner)
    early = start_report(claim).model_copy(
        update={"process_started_at": claim.lease_expires_at - timedelta(hours=1)}
    )
    assert await leasing.report_start(driver, runner=runner, start=early) == WriteStatus.OK
    row = sync_conn.execute(
        "SELECT x.launched_at = j.claimed_at, x.process_started_at < j.claimed_at "
        "FROM fleetq.executions x JOIN fleetq.jobs j ON j.id = x.job_id WHERE x.job_id = $1",
        [claim.job_id],
    ).fetchone()
    assert row == (True, True)  # clamped, and the node's own figure kept as evidence


async def test_renewal_skips_a_row_another_transaction_holds(driver: Driver, db_dsn: str) -> None:
    """A handler's `ctx.transaction()` holds its job's row: renewal answers 'busy' for
    it at once (it waited, and every other lease of the runner waited with it)."""
    from fleetq.core.db import connect

    runner = await fleet.runner(driver)
    for _ in range(2):
        await _job(driver)
    held, other = await leasing.claim(driver, runner=runner, lane="checks", limit=2)
    with connect(db_dsn) as holder:  # a transaction left open, like a handler's
        holder.execute(b"SELECT 1 FROM fleetq.jobs WHERE id = $1 FOR UPDATE", [held.job_id])
        answers = await leasing.heartbeat(
            driver,
            runner=runner,
            leases=[(held.job_id, held.lease_version), (other.job_id, other.lease_version)],
        )
        holder.rollback()
    assert [(a.job_id, a.status) for a in answers] == [
        (held.job_id, WriteStatus.BUSY),
        (other.job_id, WriteStatus.OK),
    ]
    kinds = [e.kind for e in await readers.events(driver, job_id=held.job_id)]
    assert "stale_rejected" not in kinds


async def test_a_busy_renewal_outlives_the_session_that_held_the_row(
    driver: Driver, db_dsn: str
) -> None:
    """The runner counts a renewal answered 'busy' as renewed, so the database must too.
    The handler's transaction held the row while the lease ran out in the database; the
    server then ended that session (a cut connection, idle_in_transaction_session_timeout):
    the row came free with an expired lease and the reaper gave the job to another
    runner while the first, its fence clock fresh, still ran it."""
    from fleetq.core.db import connect

    runner = await fleet.runner(driver)
    await _job(driver)
    claim = await _claim_one(driver, runner)
    assert await leasing.report_start(driver, runner=runner, start=start_report(claim)) == "ok"
    lease = [(claim.job_id, claim.lease_version)]
    with connect(db_dsn, autocommit=True) as admin:
        # the lease runs out in the database while the handler holds the row
        admin.execute(
            "UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() + interval '1 second' "
            "WHERE id = $1",
            [claim.job_id],
        )
        session = contextlib.ExitStack()
        handler = session.enter_context(connect(db_dsn))
        (pid,) = handler.execute("SELECT pg_backend_pid()").fetchone() or ()
        handler.execute(b"SELECT 1 FROM fleetq.jobs WHERE id = $1 FOR UPDATE", [claim.job_id])
        answers = await leasing.heartbeat(driver, runner=runner, leases=lease)
        assert [a.status for a in answers] == [WriteStatus.BUSY]

        def expired() -> bool:
            row = admin.execute(
                "SELECT lease_expires_at < clock_timestamp() FROM fleetq.jobs WHERE id = $1",
                [claim.job_id],
            ).fetchone()
            return bool(row and row[0])

        wait_for(expired, "the lease running out in the database")
        admin.execute("SELECT pg_terminate_backend($1)", [pid])

        def gone() -> bool:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", [pid]
            ).fetchone()
            return row is not None and row[0] == 0

        wait_for(gone, "the handler's session ending")
        with contextlib.suppress(ConnectionFailed):  # its session is gone: closing says so
            session.close()
    assert (await leasing.reap(driver)).requeued == 0
    job = await readers.job(driver, claim.job_id)
    assert (job.state, job.lease_version) == (JobState.RUNNING, claim.lease_version)
    answers = await leasing.heartbeat(driver, runner=runner, leases=lease)
    assert [a.status for a in answers] == [WriteStatus.OK]


async def test_a_start_report_waiting_on_executions_leaves_its_job_renewable(
    driver: Driver, db_dsn: str
) -> None:
    """A start report that must wait on `executions` (an index built on it without
    CONCURRENTLY, a VACUUM FULL: here a SHARE lock) waited holding its job's row, so the
    renewal answered 'busy' for as long as it waited (up to lock_timeout) and a healthy
    run could fence itself. It now waits before it touches the job."""
    from fleetq.core.db import connect

    runner = await fleet.runner(driver)
    await _job(driver)
    claim = await _claim_one(driver, runner)
    start = start_report(claim)
    answers: list[object] = []

    def report(conn: SyncConnection) -> None:
        (row,) = conn.execute(
            queries.sql("lease_report_start"),
            [
                runner,
                start.job_id,
                start.lease_version,
                start.node,
                start.run_id,
                start.pid,
                start.process_started_at,
                None,
            ],
        ).fetchall()
        conn.commit()
        answers.append(row[0])

    with connect(db_dsn) as holder, connect(db_dsn) as reporter:
        holder.execute(b"LOCK TABLE fleetq.executions IN SHARE MODE")
        (pid,) = reporter.execute("SELECT pg_backend_pid()").fetchone() or ()
        sent = threading.Thread(target=report, args=(reporter,))
        sent.start()
        wait_for(lambda: blocked_or_done(db_dsn, pid, sent), "the start report to wait")
        renewed = await leasing.heartbeat(
            driver, runner=runner, leases=[(claim.job_id, claim.lease_version)]
        )
        holder.rollback()
        sent.join(timeout=10)
        assert not sent.is_alive()
    assert [(a.job_id, a.status) for a in renewed] == [(claim.job_id, WriteStatus.OK)]
    assert answers == ["ok"]
    assert (await readers.job(driver, claim.job_id)).state == JobState.RUNNING


async def test_a_start_report_takes_jobs_before_executions_as_migrations_do(
    driver: Driver, db_dsn: str
) -> None:
    """A transaction that locks `jobs` and then `executions` (as migration 0024's
    ALTER TABLEs did) and a start report must not deadlock: the report takes its tables
    in that order too. Taking `executions` first, it held it while waiting for `jobs`,
    and the second lock closed the cycle."""
    from fleetq.core.db import connect

    runner = await fleet.runner(driver)
    await _job(driver)
    claim = await _claim_one(driver, runner)
    start = start_report(claim)
    answers: list[object] = []

    def report(conn: SyncConnection) -> None:
        (row,) = conn.execute(
            queries.sql("lease_report_start"),
            [
                runner,
                start.job_id,
                start.lease_version,
                start.node,
                start.run_id,
                start.pid,
                start.process_started_at,
                None,
            ],
        ).fetchall()
        conn.commit()
        answers.append(row[0])

    with connect(db_dsn) as migration, connect(db_dsn) as reporter:
        migration.execute(b"LOCK TABLE fleetq.jobs IN SHARE MODE")
        (pid,) = reporter.execute("SELECT pg_backend_pid()").fetchone() or ()
        sent = threading.Thread(target=report, args=(reporter,))
        sent.start()
        wait_for(lambda: blocked_or_done(db_dsn, pid, sent), "the start report to wait")
        migration.execute(b"LOCK TABLE fleetq.executions IN SHARE MODE")  # no deadlock
        migration.commit()
        sent.join(timeout=10)
        assert not sent.is_alive()
    assert answers == ["ok"]


async def test_a_write_racing_the_runner_s_own_outcome_is_a_self_race(driver: Driver) -> None:
    """A heartbeat or a release that raced the runner's own committed outcome was counted
    as a stale rejection, like a zombie's (2 in a run with no fault at all)."""
    runner = await fleet.runner(driver)
    await _job(driver)
    claim = await _claim_one(driver, runner)
    assert await leasing.complete(driver, runner=runner, outcome=_outcome(claim)) == "ok"
    (beat,) = await leasing.heartbeat(
        driver, runner=runner, leases=[(claim.job_id, claim.lease_version)]
    )
    assert beat.status == WriteStatus.STALE  # the answer itself is unchanged
    with pytest.raises(StaleLease):
        await leasing.release(
            driver, runner=runner, job_id=claim.job_id, token=claim.lease_version, reason="bye"
        )
    (row,) = [r for r in await fleet_api.runners(driver) if r.id == runner]
    assert (row.stale_rejections, row.self_races) == (0, 2)
    kinds = [e.kind for e in await readers.events(driver, job_id=claim.job_id)]
    assert kinds.count("stale_self_race") == 2 and "stale_rejected" not in kinds


def _end(sync_conn: SyncConnection, claim: Claim) -> tuple[float, bool]:
    """(seconds from the execution's end to the database's now, end_measured)."""
    row = sync_conn.execute(
        "SELECT extract(epoch FROM clock_timestamp() - ended_at)::float8, end_measured "
        "FROM fleetq.executions WHERE job_id = $1 AND lease_version = $2",
        [claim.job_id, claim.lease_version],
    ).fetchone()
    assert row is not None and row[0] is not None, "the execution has no end"
    return float(row[0]), bool(row[1])


async def _expire(driver: Driver, sync_conn: SyncConnection, claim: Claim) -> None:
    """End the claim's lease by expiry: the reaper requeues the job (same version)."""
    sync_conn.execute(
        "UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() - interval '1 s' "
        "WHERE id = $1",
        [claim.job_id],
    )
    await leasing.reap(driver)


async def _started(driver: Driver, runner: RunnerId) -> Claim:
    await _job(driver)
    claim = await _claim_one(driver, runner)
    early = start_report(claim).model_copy(
        update={"process_started_at": claim.lease_expires_at - timedelta(hours=1)}
    )
    await leasing.report_start(driver, runner=runner, start=early)
    return claim


async def test_an_end_is_dated_from_the_runner_s_clock_of_the_exit(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """An end was the time it was recorded: after a partition, long after the exit. Each
    write that ends an execution now says how long ago the exit was, and the database
    dates the end from its own clock; an end not measured so is marked bounded."""
    runner = await fleet.runner(driver)
    exited = time.monotonic() - 40  # the process exited 40 s ago
    claim = await _started(driver, runner)
    sync_conn.execute(
        "UPDATE fleetq.executions SET launched_at = clock_timestamp() - interval '1 minute'"
    )
    report = _outcome(claim).model_copy(update={"ended_monotonic": exited})
    assert await leasing.complete(driver, runner=runner, outcome=report) == WriteStatus.OK
    ago, measured = _end(sync_conn, claim)
    assert measured and 40 <= ago < 45, ago

    confirmed = await _started(driver, runner)
    sync_conn.execute(
        "UPDATE fleetq.executions SET launched_at = clock_timestamp() - interval '1 minute'"
    )
    await leasing.confirm_stop(
        driver,
        runner=runner,
        job_id=confirmed.job_id,
        token=confirmed.lease_version,
        signal=9,
        reason="superseded",
        ended_monotonic=exited,
    )
    ago, measured = _end(sync_conn, confirmed)
    assert measured and 40 <= ago < 45, ago

    released = await _started(driver, runner)
    # never before the launch: launched 5 s ago, "exited" 40 s ago (a clock glitch)
    sync_conn.execute(
        "UPDATE fleetq.executions SET launched_at = clock_timestamp() - interval '5 seconds' "
        "WHERE job_id = $1",
        [released.job_id],
    )
    await leasing.release(
        driver,
        runner=runner,
        job_id=released.job_id,
        token=released.lease_version,
        reason="self-fenced",
        fenced=True,
        ended_monotonic=exited,
    )
    ago, measured = _end(sync_conn, released)
    assert measured and 5 <= ago < 10, ago

    unmeasured = await _started(driver, runner)
    await leasing.complete(driver, runner=runner, outcome=_outcome(unmeasured))
    ago, measured = _end(sync_conn, unmeasured)
    assert not measured and ago < 5


async def test_a_stale_outcome_closes_the_zombie_s_own_execution(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """A zombie's late outcome changes no job, but it proves its run ended: its execution
    gets its (measured) end, which closes the overlap window it left open."""
    a = await fleet.runner(driver)
    b = await fleet.runner(driver, "r2")
    old = await _started(driver, a)
    sync_conn.execute(
        "UPDATE fleetq.executions SET launched_at = clock_timestamp() - interval '1 minute'"
    )
    await _expire(driver, sync_conn, old)
    new = await _claim_one(driver, b)
    assert new.lease_version == old.lease_version + 1
    late = _outcome(old).model_copy(update={"ended_monotonic": time.monotonic() - 2})
    with pytest.raises(StaleLease):
        await leasing.complete(driver, runner=a, outcome=late)
    ago, measured = _end(sync_conn, old)
    assert measured and 2 <= ago < 7, ago
    job = await readers.job(driver, old.job_id)
    assert (job.state, job.lease_owner, job.lease_version) == (JobState.CLAIMED, b, 2)


def _inline_handler(sync_conn: SyncConnection) -> None:
    """Operation tools/inline: an in-process handler in lane checks."""
    sync_conn.execute(
        "INSERT INTO fleetq.operations (project, name, lane, handler) "
        "VALUES ('tools', 'inline', 'checks', 'tests.handlers:record_effect')"
    )


def _executions(sync_conn: SyncConnection, table: str) -> list[tuple[object, ...]]:
    return [
        tuple(r)
        for r in sync_conn.execute(
            "SELECT x.job_id, x.lease_version, x.runner_id, x.node, x.launched_at = "
            "j.claimed_at, x.start_reported_at = j.claimed_at, x.ended_at IS NOT NULL, "
            f"x.stop_reason, x.stop_requested_at IS NOT NULL, x.run_id IS NULL FROM {table} x "
            "JOIN fleetq.jobs j ON j.id = x.job_id "
            "ORDER BY x.job_id, x.lease_version"
        ).fetchall()
    ]


async def test_a_handler_s_execution_runs_from_its_claim_and_is_a_row_once_its_lease_ends(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """A handler starts when it is claimed: the readers of executions (overlaps, the
    console, the report) see it from then on, launched at its claim, though the row is
    written only when its lease ends (once per job instead of twice: issue 18)."""
    _inline_handler(sync_conn)
    runner = await fleet.runner(driver)
    await _job(driver, "inline")
    await _job(driver, "lint")
    claims = await leasing.claim(driver, runner=runner, lane="checks", limit=2)
    inline = next(c for c in claims if c.operation == "inline")
    assert _executions(sync_conn, "fleetq.executions") == []
    assert _executions(sync_conn, "fleetq.all_executions") == [
        (
            inline.job_id,
            inline.lease_version,
            runner,
            "node-a",
            True,
            True,
            False,
            None,
            False,
            True,
        )
    ]
    # the command's execution is its start report's, never the claim's
    lint = next(c for c in claims if c.operation == "lint")
    await leasing.complete(driver, runner=runner, outcome=_outcome(lint))
    await leasing.complete(driver, runner=runner, outcome=_outcome(inline))
    assert _executions(sync_conn, "fleetq.executions") == [
        (inline.job_id, inline.lease_version, runner, "node-a", True, True, True, None, False, True)
    ]
    assert _executions(sync_conn, "fleetq.all_executions") == _executions(
        sync_conn, "fleetq.executions"
    )


@pytest.mark.parametrize("end", ["expiry", "cancel", "release", "lost", "stop"])
async def test_every_end_of_a_handler_s_lease_records_its_execution(
    driver: Driver, sync_conn: SyncConnection, end: str
) -> None:
    """Whatever ends a handler's lease but its outcome writes its execution first, while
    the job's row still names it: open where the handler may run on (an expired lease:
    a frozen handler; a cancel: stop requested), so the overlap with the next token shows
    until the stop is confirmed or the stale outcome arrives; closed where the runner
    said it is gone. Commands' claims that launched nothing still get no row."""
    _inline_handler(sync_conn)
    runner = await fleet.runner(driver)
    await _job(driver, "inline")
    await _job(driver, "lint")
    claims = await leasing.claim(driver, runner=runner, lane="checks", limit=2)
    for claim in claims:
        if end == "expiry":
            sync_conn.execute(
                "UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() - interval '1 s'"
            )
            await leasing.reap(driver)
        elif end == "cancel":
            await producer.cancel(driver, job_id=claim.job_id, actor="ops")
        elif end == "release":
            await leasing.release(
                driver,
                runner=runner,
                job_id=claim.job_id,
                token=claim.lease_version,
                reason="shutdown",
            )
        elif end == "lost":
            await leasing.report_lost(
                driver,
                runner=runner,
                job_id=claim.job_id,
                token=claim.lease_version,
                reason="launched nothing",
            )
        else:
            await leasing.confirm_stop(
                driver,
                runner=runner,
                job_id=claim.job_id,
                token=claim.lease_version,
                signal=None,
                reason="timeout",
            )
    inline = next(c for c in claims if c.operation == "inline")
    expected = {
        "expiry": (False, None, False),
        "cancel": (False, None, True),
        "release": (True, "shutdown", False),
        "lost": (True, "lost", False),
        "stop": (True, "timeout", False),
    }[end]
    assert _executions(sync_conn, "fleetq.executions") == [
        (inline.job_id, inline.lease_version, runner, "node-a", True, True, *expected, True)
    ]
    assert _executions(sync_conn, "fleetq.all_executions") == _executions(
        sync_conn, "fleetq.executions"
    )


async def test_a_frozen_handler_s_overlap_with_its_next_holder_shows_while_both_run(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """A handler frozen past its lease and its job's next holder, also a handler, both
    run: neither has a finished row, the newer none at all (its lease lives), yet
    `fleetq overlaps`, the console's alert and the job's detail each show both."""
    _inline_handler(sync_conn)
    a = await fleet.runner(driver)
    b = await fleet.runner(driver, "r2")
    job = await _job(driver, "inline")
    frozen = await _claim_one(driver, a)
    sync_conn.execute(
        "UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() - interval '1 s'"
    )
    await leasing.reap(driver)
    newer = await _claim_one(driver, b)
    assert (newer.job_id, newer.lease_version) == (job, frozen.lease_version + 1)

    (window,) = await stats.overlaps(driver, open_only=True)
    assert (window.job_id, window.older_token, window.newer_token) == (job, 1, 2)
    assert (window.older_runner, window.newer_runner) == (a, b)
    overview = await views.overview(driver)
    assert [o.job_id for o in overview.alerts.open_overlaps] == [job]
    detail = await views.job_detail(driver, job)
    assert [(x.lease_version, x.runner_id, x.ended_at) for x in detail.executions] == [
        (1, a, None),
        (2, b, None),
    ]


async def test_a_handler_claimed_before_the_upgrade_is_ended_by_its_outcome(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """Before migration 0025 a handler's claim wrote its execution, open: a handler still
    running across the upgrade has that row, and its outcome must end it (the outcome
    writes only the rows it has not got, and ends the others)."""
    _inline_handler(sync_conn)
    runner = await fleet.runner(driver)
    await _job(driver, "inline")
    await _job(driver, "inline")
    old, new = await leasing.claim(driver, runner=runner, lane="checks", limit=2)
    sync_conn.execute(  # as the claim wrote it then
        "INSERT INTO fleetq.executions (job_id, lease_version, runner_id, node, run_id, "
        "launched_at, start_reported_at) SELECT id, lease_version, lease_owner, 'node-a', "
        "gen_random_uuid(), claimed_at, claimed_at FROM fleetq.jobs WHERE id = $1",
        [old.job_id],
    )
    answers = await leasing.complete_many(
        driver, runner=runner, outcomes=[_outcome(old, code=3), _outcome(new, code=4)]
    )
    assert [a.status for a in answers] == [WriteStatus.OK, WriteStatus.OK]
    rows = sync_conn.execute(
        "SELECT job_id, ended_at IS NOT NULL, exit_code FROM fleetq.executions ORDER BY job_id"
    ).fetchall()
    assert [tuple(r) for r in rows] == [(old.job_id, True, 3), (new.job_id, True, 4)]


async def test_a_run_id_names_one_launched_process_and_a_handler_s_run_has_none(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """A run id is what the runner finds and kills a command's process by, so no two
    executions share one; a handler launches no process and its execution has none (a
    random one per job was a btree insert at a random place: migration 0026)."""
    _inline_handler(sync_conn)
    runner = await fleet.runner(driver)
    for _ in range(2):
        await _job(driver, "inline")
    for claim in await leasing.claim(driver, runner=runner, lane="checks", limit=2):
        await leasing.complete(driver, runner=runner, outcome=_outcome(claim))
    rows = sync_conn.execute("SELECT run_id FROM fleetq.executions").fetchall()
    assert [tuple(r) for r in rows] == [(None,), (None,)]
    run = uuid.uuid4()
    insert = (
        "INSERT INTO fleetq.executions (job_id, lease_version, runner_id, node, run_id) "
        "VALUES ($1, 9, $2, 'node-a', $3)"
    )
    sync_conn.execute(insert, [-1, runner, run])
    with pytest.raises(psycopg.errors.UniqueViolation, match="executions_run_id_key"):
        sync_conn.execute(insert, [-2, runner, run])
