"""A claim that finds nothing writes nothing (issue 18). Every submit's NOTIFY wakes
every runner serving its lane and one of them takes the job; the others' claims used to
lock their runner's row all the same, which is a write (a transaction id, WAL, a dirtied
page) for nothing. Here each claim runs in a transaction of its own and
`txid_current_if_assigned()` says whether it wrote anything (mutant
claim-locks-runner-before-jobs)."""

from __future__ import annotations

import uuid

from fleetq.core import leasing, producer
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import Driver
from fleetq.core.models import Outcome, OutcomeReport
from tests import fleet
from tests.fleet import SHA

CLAIM = "SELECT job_id FROM fleetq.claim($1, $2, 8, gen_random_uuid())"


def _claim_in_a_transaction(dsn: str, runner: str, lane: str) -> tuple[list[int], bool]:
    """The jobs a claim took, and whether its transaction wrote anything."""
    with connect(dsn) as conn:
        taken = [row[0] for row in conn.execute(CLAIM.encode(), [runner, lane]).fetchall()]
        row = conn.execute("SELECT txid_current_if_assigned() IS NOT NULL").fetchone()
        conn.commit()
    assert row is not None
    return taken, bool(row[0])


async def test_a_claim_that_finds_nothing_writes_nothing(
    driver: Driver, db_dsn: str, sync_conn: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver, "r1", lanes={"checks": 1, "control": 1})
    # an empty lane
    assert _claim_in_a_transaction(db_dsn, runner, "checks") == ([], False)
    # a lane holding only work this runner can never run (a capability it lacks)
    await producer.submit(
        driver, project="webapp", operation="browser", commit=SHA, submitted_by="ci"
    )
    assert _claim_in_a_transaction(db_dsn, runner, "checks") == ([], False)
    # work it can run is taken, and that claim writes
    unit = await producer.submit(
        driver, project="webapp", operation="unit", commit=SHA, submitted_by="ci"
    )
    assert _claim_in_a_transaction(db_dsn, runner, "checks") == ([unit.job_id], True)
    # its one slot is now full: more work waits, and looking for it writes nothing
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="ci")
    assert _claim_in_a_transaction(db_dsn, runner, "checks") == ([], False)


async def test_a_claim_that_loses_the_race_writes_nothing(
    driver: Driver, db_dsn: str, sync_conn: SyncConnection
) -> None:
    """Two runners woken by one submit both find the job queued; the one whose claim
    finds it held by the other takes nothing, and writes nothing either: the claim holds
    its jobs before it locks its runner's row (mutant claim-locks-runner-before-jobs)."""
    fleet.operations(sync_conn)
    first = await fleet.runner(driver, "r1")
    second = await fleet.runner(driver, "r2")
    job = await producer.submit(
        driver, project="tools", operation="lint", commit=SHA, submitted_by="ci"
    )
    with connect(db_dsn) as winner:
        taken = [row[0] for row in winner.execute(CLAIM.encode(), [first, "checks"]).fetchall()]
        assert taken == [job.job_id]  # held, not yet committed
        assert _claim_in_a_transaction(db_dsn, second, "checks") == ([], False)
        winner.commit()


async def test_jobs_held_and_not_taken_wake_the_lane(
    driver: Driver, db_dsn: str, sync_conn: SyncConnection
) -> None:
    """A claim holds the jobs it chose on an unlocked look, then takes as many as its
    runner's room allows under the lock. Other runners skipped the rest while they were
    held: the claim tells them to look again, or they would wait for their next poll."""
    fleet.operations(sync_conn)
    # room for one 1024 MB unit job, not two: each fits alone, both do not
    small = await fleet.runner(driver, "small", memory_mb=1500)
    for _ in range(2):
        await producer.submit(
            driver, project="webapp", operation="unit", commit=SHA, submitted_by="ci"
        )
    with connect(db_dsn, autocommit=True) as listener:
        listener.execute("LISTEN fleetq_work")
        taken, _ = _claim_in_a_transaction(db_dsn, small, "checks")
        assert len(taken) == 1
        heard = [n.payload for n in listener.notifies(timeout=10, stop_after=1)]
    assert heard == ["checks"]


async def test_a_claim_that_fills_its_room_wakes_an_idle_runner(
    driver: Driver, db_dsn: str, sync_conn: SyncConnection
) -> None:
    """A new job is announced to one runner; when that runner's claim fills its room
    with jobs still queued (several were announced to it at once), the lane is told, so
    an idle runner takes them now rather than at its next look."""
    fleet.operations(sync_conn)
    first = await fleet.runner(driver, "r1", lanes={"checks": 1})
    await fleet.runner(driver, "r2", lanes={"checks": 1})
    for _ in range(2):
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="ci"
        )
    with connect(db_dsn, autocommit=True) as listener:
        listener.execute("LISTEN fleetq_work")
        taken, _ = _claim_in_a_transaction(db_dsn, first, "checks")
        assert len(taken) == 1
        heard = [n.payload for n in listener.notifies(timeout=10, stop_after=1)]
    assert heard == ["checks"]


async def test_a_refill_that_fills_its_room_does_not_wake_the_lane(
    driver: Driver, db_dsn: str, sync_conn: SyncConnection
) -> None:
    """The claim an outcome batch carries (the refill) is a runner draining a backlog,
    whose submits woke the lane already. Notifying on each refill that fills its room
    while another runner is idle made nearly every refill of a 100-runner fleet NOTIFY,
    and notifying commits run one at a time: 190 jobs/s instead of 415."""
    fleet.operations(sync_conn)
    first = await fleet.runner(driver, "r1", lanes={"checks": 1})
    await fleet.runner(driver, "r2", lanes={"checks": 1})  # idle throughout
    for _ in range(3):
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="ci"
        )
    (running,) = await leasing.claim(driver, runner=first, lane="checks", limit=1)
    with connect(db_dsn, autocommit=True) as listener:
        listener.execute("LISTEN fleetq_work")
        _answers, refilled = await leasing.complete_and_claim(
            driver,
            runner=first,
            outcomes=[
                OutcomeReport(
                    job_id=running.job_id,
                    lease_version=running.lease_version,
                    outcome=Outcome.SUCCEEDED,
                    exit_code=0,
                )
            ],
            lane="checks",
            limit=1,
            claim_id=uuid.uuid4(),
        )
        assert len(refilled) == 1  # its room is full again, one job still queued
        # notifications arrive in commit order: the first heard is the marker, unless
        # the refill notified
        await driver.fetch("SELECT pg_notify('fleetq_work', 'marker')")
        heard = [n.payload for n in listener.notifies(timeout=10, stop_after=1)]
    assert heard == ["marker"]
