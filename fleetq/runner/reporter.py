"""Record: exactly one fenced outcome write per execution, batched.

Executions hand their outcome to the reporter and wait for the answer. The reporter
writes whatever is pending in one `complete` statement, so a runner finishing 64 jobs
makes one round trip, and an idle runner still writes a lone outcome at once. A
connection failure keeps the batch and retries it (an outcome that did commit answers
`already`, so a retry is safe); a stale answer is logged and counted, never retried.
"""

from __future__ import annotations

import asyncio
import logging

from fleetq.core import leasing
from fleetq.core.driver import Driver
from fleetq.core.errors import ConnectionFailed
from fleetq.core.models import OutcomeReport, RunnerId, WriteStatus
from fleetq.runner import metrics

log = logging.getLogger(__name__)
MAX_BATCH = 256
RETRY_S = 0.5


class Reporter:
    """Batches outcome writes for one runner."""

    def __init__(self, driver: Driver, runner: RunnerId) -> None:
        self.driver = driver
        self.runner = runner
        self.pending: list[tuple[OutcomeReport, asyncio.Future[WriteStatus]]] = []
        self.wake = asyncio.Event()

    async def record(self, report: OutcomeReport) -> WriteStatus:
        """Queue one outcome and wait until it is written (or found stale)."""
        future: asyncio.Future[WriteStatus] = asyncio.get_running_loop().create_future()
        self.pending.append((report, future))
        self.wake.set()
        return await future

    async def run(self, stop: asyncio.Event) -> None:
        """Write pending outcomes until stopped and nothing is pending."""
        while not (stop.is_set() and not self.pending):
            if not self.pending:
                self.wake.clear()
                waiter = asyncio.ensure_future(stop.wait())
                await asyncio.wait(
                    {waiter, asyncio.ensure_future(self.wake.wait())},
                    return_when=asyncio.FIRST_COMPLETED,
                )
                waiter.cancel()
                continue
            await self.run_once()

    async def run_once(self) -> int:
        """Write one batch; returns how many outcomes it settled."""
        batch, self.pending = self.pending[:MAX_BATCH], self.pending[MAX_BATCH:]
        try:
            answers = await leasing.complete_many(
                self.driver, runner=self.runner, outcomes=[r for r, _ in batch]
            )
        except ConnectionFailed as exc:
            log.warning("outcome write failed (%s); retrying %d outcomes", exc, len(batch))
            self.pending = batch + self.pending
            await asyncio.sleep(RETRY_S)
            return 0
        for (report, future), answer in zip(batch, answers, strict=True):
            if answer.status == WriteStatus.STALE:
                metrics.STALE.labels("outcome").inc()
                log.warning(
                    "outcome stale job=%d token=%d: the lease had moved on; not retried",
                    report.job_id,
                    report.lease_version,
                )
            else:
                metrics.outcome(report.outcome.value).inc()
            if not future.done():
                future.set_result(answer.status)
        return len(batch)
