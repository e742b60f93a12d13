"""Edges of a lease the main tests pass by: a retried outcome keeps the end its run was
given; a stop confirmed for a cancelled job gives back that job's room while the
runner's other jobs run on; a handler's transaction locks its job under its own token
only; a plain renewal records no busy renewal."""

from __future__ import annotations

import threading

from fleetq.core import leasing, producer
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import Driver
from fleetq.core.models import (
    Claim,
    FencingToken,
    JobId,
    Outcome,
    OutcomeReport,
    WriteStatus,
)
from tests import fleet
from tests.locks import blocked_or_done, wait_for


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
    (claim,) = await fleet.running(driver, runner, 1)
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
    keeps, stopped = await fleet.running(driver, runner, 2)
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
    (claim,) = await fleet.running(driver, runner, 1)
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
    (claim,) = await fleet.running(driver, runner, 1)
    unknown = (JobId(claim.job_id + 100), FencingToken(1))
    leases = [(claim.job_id, claim.lease_version), unknown]
    beats = await leasing.heartbeat(driver, runner=runner, leases=leases)
    assert [b.status for b in beats] == [WriteStatus.OK, WriteStatus.STALE]
    assert sync_conn.execute("SELECT count(*) FROM fleetq.busy_renewals").fetchone() == (0,)


async def test_a_hand_back_racing_a_new_claim_is_stale_and_leaves_the_new_lease(
    driver: Driver, sync_conn: SyncConnection, db_dsn: str
) -> None:
    """A release checks its lease with the job's row locked: racing a reap and a new
    claim that hold the row, it waits for them, then finds the lease moved on and is
    answered stale; the new holder's lease stands (mutant: the guard's lock)."""
    fleet.operations(sync_conn)
    one = await fleet.runner(driver)
    other = await fleet.runner(driver, "r2", node="node-b")
    (claim,) = await fleet.running(driver, one, 1)
    answer: list[str] = []
    with connect(db_dsn) as mover, connect(db_dsn, autocommit=True) as releaser:
        # the lease expires, is reaped and claimed by another, not yet committed
        mover.execute("SELECT * FROM fleetq.reap(1000, clock_timestamp() + interval '1 day')")
        mover.execute("SELECT * FROM fleetq.claim($1, 'checks', 1, gen_random_uuid())", [other])
        (pid,) = releaser.execute("SELECT pg_backend_pid()").fetchone() or (0,)

        def release() -> None:
            row = releaser.execute(
                "SELECT fleetq.release($1, $2, $3, 'shutting down', false, NULL)",
                [one, claim.job_id, claim.lease_version],
            ).fetchone()
            answer.append(str(row[0]) if row else "")

        thread = threading.Thread(target=release)
        thread.start()
        wait_for(lambda: blocked_or_done(db_dsn, int(pid), thread), "the release to wait")
        mover.commit()
        thread.join(timeout=30)
    assert answer == ["stale"]
    row = sync_conn.execute(
        "SELECT state, lease_owner, lease_version FROM fleetq.jobs WHERE id = $1", [claim.job_id]
    ).fetchone()
    assert row == ("claimed", other, claim.lease_version + 1)


async def test_a_stop_confirmed_twice_at_once_gives_back_its_room_once(
    driver: Driver, sync_conn: SyncConnection, db_dsn: str
) -> None:
    """A confirmation retried while the first is still in flight (its reply was slow)
    waits for it on the job's row, then finds the room given back already: the runner's
    other job still holds its slot (mutant: the confirmation's lock)."""
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver)
    keeps, stopped = await fleet.running(driver, runner, 2)
    await producer.cancel(driver, job_id=stopped.job_id, actor="ops", reason="enough")
    confirm = "SELECT fleetq.confirm_stop($1, $2, $3, 15, 'cancelled', NULL)"
    args = [runner, stopped.job_id, stopped.lease_version]
    done: list[BaseException | None] = []
    with connect(db_dsn) as first, connect(db_dsn, autocommit=True) as retry:
        first.execute(confirm, args)
        (pid,) = retry.execute("SELECT pg_backend_pid()").fetchone() or (0,)

        def again() -> None:
            try:
                retry.execute(confirm, args)
                done.append(None)
            except Exception as exc:  # reported below, in the test's own thread
                done.append(exc)

        thread = threading.Thread(target=again)
        thread.start()
        wait_for(lambda: blocked_or_done(db_dsn, int(pid), thread), "the retry to wait")
        first.commit()
        thread.join(timeout=30)
    assert done == [None]
    used = sync_conn.execute(
        "SELECT slots_used FROM fleetq.runner_lanes WHERE runner_id = $1 AND lane = 'checks'",
        [runner],
    ).fetchone()
    assert used == (1,)
    assert keeps.job_id


async def test_a_renewal_answers_busy_for_a_held_row_without_waiting(
    driver: Driver, sync_conn: SyncConnection, db_dsn: str
) -> None:
    """A renewal never waits on a row a handler's transaction holds: under a 2 s lock
    timeout it answers at once, busy for that job and ok for the other."""
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver)
    held, other = await fleet.running(driver, runner, 2)
    with connect(db_dsn) as holder, connect(db_dsn, autocommit=True) as beat:
        holder.execute("SELECT 1 FROM fleetq.jobs WHERE id = $1 FOR UPDATE", [held.job_id])
        beat.execute("SET lock_timeout = '2s'")
        rows = beat.execute(
            "SELECT job_id, status FROM fleetq.heartbeat($1, $2, $3) ORDER BY job_id",
            [runner, [held.job_id, other.job_id], [held.lease_version, other.lease_version]],
        ).fetchall()
        holder.rollback()
    assert rows == [(held.job_id, "busy"), (other.job_id, "ok")]
