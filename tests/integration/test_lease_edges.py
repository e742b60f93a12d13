"""Edges of a lease the main tests pass by: a retried outcome keeps the end its run was
given; a stop confirmed for a cancelled job gives back that job's room while the
runner's other jobs run on; a handler's transaction locks its job under its own token
only; a plain renewal records no busy renewal."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from fleetq.core import leasing, producer
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver
from fleetq.core.models import (
    Claim,
    FencingToken,
    JobId,
    Outcome,
    OutcomeReport,
    RunnerId,
    StartReport,
    WriteStatus,
)
from tests import fleet
from tests.fleet import SHA


async def _running(driver: Driver, runner: RunnerId, n: int) -> list[Claim]:
    for _ in range(n):
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
        )
    claims = await leasing.claim(driver, runner=runner, lane="checks", limit=n)
    for c in claims:
        start = StartReport(
            job_id=c.job_id,
            lease_version=c.lease_version,
            node="node-a",
            run_id=uuid.uuid4(),
            pid=4242,
            process_started_at=datetime.now(UTC),
        )
        await leasing.report_start(driver, runner=runner, start=start)
    return claims


def _done(claim: Claim) -> OutcomeReport:
    return OutcomeReport(
        job_id=claim.job_id,
        lease_version=claim.lease_version,
        outcome=Outcome.SUCCEEDED,
        exit_code=0,
    )


async def test_a_retried_outcome_keeps_the_end_its_run_was_given(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver)
    (claim,) = await _running(driver, runner, 1)
    assert await leasing.complete(driver, runner=runner, outcome=_done(claim)) == WriteStatus.OK
    end = "SELECT ended_at FROM fleetq.executions WHERE job_id = $1"
    first = sync_conn.execute(end, [claim.job_id]).fetchone()
    answer = await leasing.complete(driver, runner=runner, outcome=_done(claim))
    assert answer == WriteStatus.ALREADY
    assert sync_conn.execute(end, [claim.job_id]).fetchone() == first


async def test_a_confirmed_stop_gives_back_its_own_job_s_room(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver)
    keeps, stopped = await _running(driver, runner, 2)
    await producer.cancel(driver, job_id=stopped.job_id, actor="ops", reason="enough")
    await leasing.confirm_stop(
        driver,
        runner=runner,
        job_id=stopped.job_id,
        token=stopped.lease_version,
        signal=15,
        reason="cancelled",
    )
    rows = sync_conn.execute(
        "SELECT id, reserved_on FROM fleetq.jobs WHERE id = ANY ($1) ORDER BY id",
        [[keeps.job_id, stopped.job_id]],
    ).fetchall()
    assert rows == [(keeps.job_id, runner), (stopped.job_id, None)]
    used = sync_conn.execute(
        "SELECT slots_used FROM fleetq.runner_lanes WHERE runner_id = $1 AND lane = 'checks'",
        [runner],
    ).fetchone()
    assert used == (1,)


async def test_a_handler_locks_its_job_under_its_own_token_only(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver)
    (claim,) = await _running(driver, runner, 1)
    lock = "SELECT fleetq.lock_for_handler($1, $2, $3)"
    for token in (claim.lease_version - 1, claim.lease_version + 1):
        assert sync_conn.execute(lock, [claim.job_id, runner, token]).fetchone() == (None,)
    assert sync_conn.execute(lock, [claim.job_id, runner, claim.lease_version]).fetchone() == (1,)
    sync_conn.rollback()


async def test_a_plain_renewal_records_no_busy_renewal(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver)
    (claim,) = await _running(driver, runner, 1)
    unknown = (JobId(claim.job_id + 100), FencingToken(1))
    leases = [(claim.job_id, claim.lease_version), unknown]
    beats = await leasing.heartbeat(driver, runner=runner, leases=leases)
    assert [b.status for b in beats] == [WriteStatus.OK, WriteStatus.STALE]
    assert sync_conn.execute("SELECT count(*) FROM fleetq.busy_renewals").fetchone() == (0,)
