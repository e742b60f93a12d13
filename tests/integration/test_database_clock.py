"""Leases are dated by the database's clock *at the statement* (clock_timestamp()), not at
the start of the transaction the statement runs in (now()). In autocommit the two are
equal, so each test here runs its write in a transaction whose start lies well behind its
clock: with now() the lease would come out short by that much (mutants
claim-lease-on-transaction-clock, heartbeat-renews-on-transaction-clock and
start-report-renews-on-transaction-clock)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest

from fleetq.core import leasing, producer
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import Driver
from tests import fleet
from tests.fleet import SHA

BEHIND_S = 0.5  # how far the transaction's start lies behind its clock
LEASE_S = 30


@pytest.fixture(autouse=True)
def _fleet(sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)
    sync_conn.execute(
        "UPDATE fleetq.settings SET value = $1 WHERE name = 'lease_seconds'", [str(LEASE_S)]
    )


def _aged_transaction(conn: SyncConnection) -> datetime:
    """Open a transaction, let its clock run ahead of its start, and return the clock."""
    conn.execute("SELECT pg_sleep($1)", [BEHIND_S])
    (start, clock) = conn.execute("SELECT now(), clock_timestamp()").fetchone() or ()
    assert (clock - start).total_seconds() >= BEHIND_S
    result: datetime = clock
    return result


async def test_a_claim_dates_its_lease_from_when_it_runs(driver: Driver, db_dsn: str) -> None:
    runner = await fleet.runner(driver)
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="a")
    with connect(db_dsn) as conn:
        clock = _aged_transaction(conn)
        (expires,) = (
            conn.execute(
                "SELECT lease_expires_at FROM fleetq.claim($1, 'checks', 1, $2)",
                [runner, uuid.uuid4()],
            ).fetchone()
            or ()
        )
        conn.commit()
    assert expires >= clock + timedelta(seconds=LEASE_S)


async def test_a_heartbeat_renews_from_when_it_runs(driver: Driver, db_dsn: str) -> None:
    runner = await fleet.runner(driver)
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="a")
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    with connect(db_dsn) as conn:
        clock = _aged_transaction(conn)
        (status, expires) = (
            conn.execute(
                "SELECT status, lease_expires_at FROM fleetq.heartbeat($1, $2, $3)",
                [runner, [claim.job_id], [claim.lease_version]],
            ).fetchone()
            or ()
        )
        conn.commit()
    assert status == "ok"
    assert expires >= clock + timedelta(seconds=LEASE_S)


async def test_a_start_report_extends_the_lease_from_when_it_runs(
    driver: Driver, db_dsn: str
) -> None:
    """Mutant start-report-renews-on-transaction-clock (issue 43, finding 3)."""
    runner = await fleet.runner(driver)
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="a")
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    with connect(db_dsn) as conn:
        clock = _aged_transaction(conn)
        (status,) = (
            conn.execute(
                "SELECT fleetq.report_start($1, $2, $3, 'n', $4, 1, NULL, 0)",
                [runner, claim.job_id, claim.lease_version, uuid.uuid4()],
            ).fetchone()
            or ()
        )
        (expires,) = (
            conn.execute(
                "SELECT lease_expires_at FROM fleetq.jobs WHERE id = $1", [claim.job_id]
            ).fetchone()
            or ()
        )
        conn.commit()
    assert status == "ok"
    assert expires >= clock + timedelta(seconds=LEASE_S)


async def test_a_claim_skips_a_job_another_transaction_holds(driver: Driver, db_dsn: str) -> None:
    """A claim never queues behind a locked row (mutant claim-waits-on-a-locked-job)."""
    runner = await fleet.runner(driver)
    first, second = [
        (
            await producer.submit(
                driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
            )
        ).job_id
        for _ in range(2)
    ]
    with connect(db_dsn) as holder, connect(db_dsn, autocommit=True) as claimer:
        holder.execute("SELECT 1 FROM fleetq.jobs WHERE id = $1 FOR UPDATE", [first])
        claimer.execute("SET lock_timeout = '2s'")  # waiting at all ends in an error
        taken = claimer.execute(
            "SELECT job_id FROM fleetq.claim($1, 'checks', 2, $2)", [runner, uuid.uuid4()]
        ).fetchall()
        holder.rollback()
    assert taken == [(second,)]
