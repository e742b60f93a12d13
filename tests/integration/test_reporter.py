"""The outcome writer: a batch the database refuses for good is settled one by one, so
one unstorable outcome never holds the others back (issue 12)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from fleetq.core import leasing, producer
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import Driver
from fleetq.core.models import Claim, Outcome, OutcomeReport, RunnerId, WriteStatus
from fleetq.runner.reporter import Refill, Reporter
from tests import fleet

POISON = "this output cannot be stored"


@pytest.fixture(autouse=True)
def _refuses_poison(sync_conn: SyncConnection) -> None:
    """A real refusal by the server (like 22021 for a NUL byte): a trigger that raises."""
    fleet.operations(sync_conn)
    sync_conn.execute(
        """
        CREATE FUNCTION public.refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.log_tail LIKE '%cannot be stored%' THEN
                RAISE EXCEPTION 'invalid byte sequence for encoding "UTF8": 0x00'
                    USING ERRCODE = '22021';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_poison BEFORE INSERT OR UPDATE ON fleetq.verdicts
            FOR EACH ROW EXECUTE FUNCTION public.refuse_poison();
        """
    )


async def _claims(driver: Driver, runner: RunnerId, n: int) -> list[Claim]:
    for i in range(n):  # one verdict each: another commit each
        await producer.submit(
            driver, project="tools", operation="lint", commit=f"{i}" * 40, submitted_by="alice"
        )
    return await leasing.claim(driver, runner=runner, lane="checks", limit=n)


async def test_an_outcome_refused_for_good_is_recorded_as_a_failure_that_says_why(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    runner = await fleet.runner(driver)
    claims = await _claims(driver, runner, 3)
    reporter = Reporter(driver, runner)
    stop = asyncio.Event()
    writer = asyncio.ensure_future(reporter.run(stop))
    reports = [
        OutcomeReport(
            job_id=c.job_id,
            lease_version=c.lease_version,
            outcome=Outcome.SUCCEEDED,
            exit_code=0,
            log_tail=POISON if i == 1 else "ok",
        )
        for i, c in enumerate(claims)
    ]
    answers = await asyncio.wait_for(
        asyncio.gather(*(reporter.record(r) for r in reports)), timeout=30
    )
    stop.set()
    await asyncio.wait_for(writer, 10)
    assert answers == [WriteStatus.OK] * 3
    rows = sync_conn.execute("SELECT state, failure_reason FROM fleetq.jobs ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["succeeded", "failed", "succeeded"]
    assert "outcome not recordable" in rows[1][1] and "0x00" in rows[1][1]


def _succeeded(claim: Claim) -> OutcomeReport:
    return OutcomeReport(
        job_id=claim.job_id,
        lease_version=claim.lease_version,
        outcome=Outcome.SUCCEEDED,
        exit_code=0,
        log_tail="ok",
    )


async def test_outcomes_and_the_claim_that_refills_their_room_are_one_transaction(
    driver: Driver, db_dsn: str, sync_conn: SyncConnection
) -> None:
    """Where a runner runs few jobs at once, each outcome frees a slot that a claim fills
    next: written together they cost one commit and one transaction id, not two. The
    claim sees the room the outcomes gave back, and a retry with the same claim id gets
    back what the first attempt took (the outcomes answer `already`)."""
    runner = await fleet.runner(driver, lanes={"checks": 1})
    (held,) = await _claims(driver, runner, 1)
    waiting = await producer.submit(
        driver, project="tools", operation="lint", commit="9" * 40, submitted_by="alice"
    )
    claim_id = uuid.uuid4()
    answers, claims = await leasing.complete_and_claim(
        driver,
        runner=runner,
        outcomes=[_succeeded(held)],
        lane="checks",
        limit=1,
        claim_id=claim_id,
    )
    # both rows were last written by one transaction
    writers = sync_conn.execute(
        "SELECT DISTINCT xmin::text FROM fleetq.jobs WHERE id = ANY ($1)",
        [[held.job_id, waiting.job_id]],
    ).fetchall()
    assert len(writers) == 1
    assert [a.status for a in answers] == [WriteStatus.OK]
    assert [c.job_id for c in claims] == [waiting.job_id]
    again, reclaimed = await leasing.complete_and_claim(
        driver,
        runner=runner,
        outcomes=[_succeeded(held)],
        lane="checks",
        limit=1,
        claim_id=claim_id,
    )
    assert [a.status for a in again] == [WriteStatus.ALREADY]
    # the same claims; the time each lease has left is read anew (it is on the clock)
    unclocked = [c.model_copy(update={"lease_left_s": None}) for c in reclaimed]
    assert unclocked == [c.model_copy(update={"lease_left_s": None}) for c in claims]
    assert all(c.lease_left_s is not None and c.lease_left_s > 0 for c in reclaimed)


async def test_the_writer_claims_for_the_room_its_batch_frees(driver: Driver) -> None:
    """The outcome writer asks the runner, per batch, which claim to send with it, and
    hands what it took back to the runner."""
    runner = await fleet.runner(driver, lanes={"checks": 1})
    (held,) = await _claims(driver, runner, 1)
    waiting = await producer.submit(
        driver, project="tools", operation="lint", commit="9" * 40, submitted_by="alice"
    )
    took: list[tuple[list[Claim], Refill]] = []
    reporter = Reporter(
        driver,
        runner,
        refill_for=lambda reports: Refill("checks", len(reports), uuid.uuid4(), 0.0),
        refilled=lambda claims, refill: took.append((claims, refill)),
    )
    stop = asyncio.Event()
    writer = asyncio.ensure_future(reporter.run(stop))
    assert await asyncio.wait_for(reporter.record(_succeeded(held)), 30) == WriteStatus.OK
    stop.set()
    await asyncio.wait_for(writer, 10)
    ((claims, refill),) = took
    assert [c.job_id for c in claims] == [waiting.job_id] and refill.lane == "checks"


async def test_an_outcome_whose_row_is_held_holds_no_other_up(
    driver: Driver, db_dsn: str, sync_conn: SyncConnection
) -> None:
    """One outcome's job row held by another transaction (a cancel kept open) held the
    whole batch: every outcome of the runner waited, retried after each lock timeout."""
    runner = await fleet.runner(driver)
    held, free = await _claims(driver, runner, 2)
    reporter = Reporter(driver, runner)
    stop = asyncio.Event()
    writer = asyncio.ensure_future(reporter.run(stop))
    with connect(db_dsn) as holder:
        holder.execute(b"SELECT 1 FROM fleetq.jobs WHERE id = $1 FOR UPDATE", [held.job_id])
        waiting = asyncio.ensure_future(reporter.record(_succeeded(held)))
        answer = await asyncio.wait_for(reporter.record(_succeeded(free)), timeout=30)
        assert answer == WriteStatus.OK and not waiting.done()
        holder.rollback()
    assert await asyncio.wait_for(waiting, timeout=30) == WriteStatus.OK
    stop.set()
    await asyncio.wait_for(writer, 10)
    rows = sync_conn.execute(b"SELECT state FROM fleetq.jobs ORDER BY id").fetchall()
    assert rows == [("succeeded",), ("succeeded",)]
