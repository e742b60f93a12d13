"""The fleet-wide passes every runner takes part in: the reaper (expired leases and due
retries; one leader at a time, `leasing.reap`) and the schedules of its own lanes."""

from __future__ import annotations

import asyncio
import logging
import math

from fleetq.core import leasing, schedules
from fleetq.core.driver import Driver
from fleetq.core.models import RunnerId

log = logging.getLogger("fleetq.runner.service")

MIN_REAP_WAIT_S = 0.05  # a retry due now is queued by the next pass, not spun on


class Passes:
    """When the next reaper pass runs, and the passes themselves."""

    def __init__(self, *, driver: Driver, runner: RunnerId, reap_interval_s: float) -> None:
        self.driver, self.runner = driver, runner
        self.reap_interval_s = reap_interval_s
        self.reap_due = math.inf  # loop time a retry falls due, which a pass must not miss
        self.reap_wake = asyncio.Event()  # set when reap_due moved sooner
        self.schedule_checks = schedules.MinuteChecks()  # when it next looks for due ticks

    def retry_soon(self, due_s: float) -> None:
        """A retry falls due in `due_s`: the next reaper pass runs then if that is sooner
        (any runner's pass at that moment queues it, this one's included)."""
        self.reap_due = min(self.reap_due, asyncio.get_running_loop().time() + due_s)
        self.reap_wake.set()

    def reap_wait(self) -> float:
        """Until the next reaper pass: the reap interval, or sooner for a retry."""
        until_due = self.reap_due - asyncio.get_running_loop().time()
        return max(MIN_REAP_WAIT_S, min(self.reap_interval_s, until_due))

    async def reap_once(self) -> None:
        self.reap_due = math.inf  # a retry that falls due later moves it again
        result = await leasing.reap(self.driver)
        if result.requeued or result.failed:
            log.info(
                "reaped expired leases: %d requeued, %d failed", result.requeued, result.failed
            )

    async def schedules_once(self) -> None:
        """Fire the due ticks of the schedules of this runner's lanes, looking once a
        minute however often this pass runs (`schedules.MinuteChecks`). Every runner of a
        lane looks, not the reaper's leader: the database lets a runner settle only the
        schedules of its own lanes, and a tick fires once whoever fires it."""
        for fired in await self.schedule_checks.check(self.driver, self.runner):
            log.info(
                "schedule %s fired job %d for its tick %s",
                fired.schedule,
                fired.job_id,
                fired.tick.isoformat(),
            )
