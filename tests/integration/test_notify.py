"""Transitions send NOTIFY hints that carry ids or lane names, never payloads."""

from __future__ import annotations

import asyncio

import asyncpg

from fleetq.core import fleet as fleet_api
from fleetq.core import leasing, producer
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver
from fleetq.core.models import RunnerState
from tests import fleet
from tests.fleet import SHA

CHANNELS = ("fleetq_work", "fleetq_events", "fleetq_control")


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
        await hints.wait_for("fleetq_work", "checks")
        await hints.wait_for("fleetq_events", "")
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
