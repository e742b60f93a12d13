"""Transitions send NOTIFY hints that carry ids or lane names, never payloads."""

from __future__ import annotations

import asyncio

import asyncpg

from fleetq.core import fleet as fleet_api
from fleetq.core import leasing, producer
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver
from fleetq.core.models import Outcome, OutcomeReport, RunnerState
from tests import fleet
from tests.fleet import SHA

CHANNELS = ("fleetq_work", "fleetq_control")


class Hints:
    """Every hint received, and a way to wait (with a deadline) for one to arrive."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.arrived = asyncio.Event()

    def __call__(self, _conn: object, _pid: int, channel: str, payload: object) -> None:
        self.seen.append((channel, str(payload)))
        self.arrived.set()

    async def wait_for(self, channel: str, payload: str) -> None:
        async with asyncio.timeout(10):
            while (channel, payload) not in self.seen:
                self.arrived.clear()
                await self.arrived.wait()


async def test_hints_on_submit_cancel_and_drain(
    db_dsn: str, driver: Driver, sync_conn: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver)
    listener = await asyncpg.connect(db_dsn)
    hints = Hints()
    for channel in CHANNELS:
        await listener.add_listener(channel, hints)
    try:
        job = await producer.submit(
            driver,
            project="tools",
            operation="lint",
            commit=SHA,
            submitted_by="alice",
            payload={"secret": "hunter2"},
        )
        # the lane, and the one runner chosen to claim (the only one here)
        await hints.wait_for("fleetq_work", f"checks {runner}")
        await leasing.claim(driver, runner=runner, lane="checks", limit=1)
        await producer.cancel(driver, job_id=job.job_id, actor="ops")
        await hints.wait_for("fleetq_control", f"job:{job.job_id}")
        await fleet_api.set_state(
            driver, runner=runner, state=RunnerState.DRAINING, reason="", actor="ops"
        )
        await hints.wait_for("fleetq_control", f"runner:{runner}")
    finally:
        await listener.close()
    assert not any("hunter2" in payload for _, payload in hints.seen)


async def test_a_new_job_is_announced_to_the_runner_with_most_room(
    db_dsn: str, driver: Driver, sync_conn: SyncConnection
) -> None:
    """A submit wakes one runner, not the whole lane: every runner of a lane LISTENs,
    and a wake-up naming only the lane makes each of them claim, though one takes the job.
    The chosen one can take the job now and has the most room left in its lane; when no
    runner can, the lane is named alone."""
    fleet.operations(sync_conn)
    busy = await fleet.runner(driver, "busy")
    idle = await fleet.runner(driver, "idle")
    for _ in range(2):
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="ci"
        )
    assert len(await leasing.claim(driver, runner=busy, lane="checks", limit=2)) == 2
    listener = await asyncpg.connect(db_dsn)
    hints = Hints()
    await listener.add_listener("fleetq_work", hints)
    try:
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="ci"
        )
        await hints.wait_for("fleetq_work", f"checks {idle}")
        # no runner has the browser capability: the lane alone, so any that gains room
        # or a new runner of the lane looks
        await producer.submit(
            driver, project="webapp", operation="browser", commit=SHA, submitted_by="ci"
        )
        await hints.wait_for("fleetq_work", "checks")
    finally:
        await listener.close()
    assert ("fleetq_work", f"checks {busy}") not in hints.seen


async def test_claims_starts_and_outcomes_send_no_notification(
    db_dsn: str, driver: Driver, sync_conn: SyncConnection
) -> None:
    """PostgreSQL commits the transactions that NOTIFY one at a time, under one lock held
    through the WAL flush: a NOTIFY from every claim and outcome serialized the queue
    (the console polls the newest event instead). Notifications arrive in commit order,
    so a marker sent last arrives first when none were sent before it."""
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver)
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="a")
    listener = await asyncpg.connect(db_dsn)
    hints = Hints()
    for channel in (*CHANNELS, "fleetq_events"):
        await listener.add_listener(channel, hints)
    try:
        (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
        await leasing.complete(
            driver,
            runner=runner,
            outcome=OutcomeReport(
                job_id=claim.job_id,
                lease_version=claim.lease_version,
                outcome=Outcome.SUCCEEDED,
                exit_code=0,
            ),
        )
        await driver.fetch("SELECT pg_notify('fleetq_control', 'marker')")
        await hints.wait_for("fleetq_control", "marker")
    finally:
        await listener.close()
    assert hints.seen == [("fleetq_control", "marker")]
