"""Record: exactly one fenced outcome write per execution, batched.

Executions hand their outcome to the reporter and wait for the answer. The reporter
writes whatever is pending in one `complete` statement, so a runner finishing 64 jobs
makes one round trip, and an idle runner still writes a lone outcome at once. Any
database error (a lost connection, a lock held past `lock_timeout`, a statement timeout)
keeps the batch and retries it with backoff (an outcome that did commit answers
`already`, so a retry is safe); a stale answer is logged and counted, never retried.
"""

from __future__ import annotations

import asyncio
import logging

from fleetq.core import leasing
from fleetq.core.driver import Driver
from fleetq.core.errors import FleetqError
from fleetq.core.models import OutcomeReport, RunnerId, WriteStatus
from fleetq.runner import metrics
from fleetq.runner.loops import Backoff, environmental

log = logging.getLogger(__name__)
MAX_BATCH = 256


class ReporterGone(FleetqError):
    """The runner's outcome writer ended (a bug); the outcome was not recorded."""


class Reporter:
    """Batches outcome writes for one runner."""

    def __init__(self, driver: Driver, runner: RunnerId) -> None:
        self.driver = driver
        self.runner = runner
        self.pending: list[tuple[OutcomeReport, asyncio.Future[WriteStatus]]] = []
        self.wake = asyncio.Event()
        self.backoff = Backoff()
        self.gone: BaseException | None = None

    async def record(self, report: OutcomeReport) -> WriteStatus:
        """Queue one outcome and wait until it is written (or found stale)."""
        if self.gone is not None:
            raise ReporterGone() from self.gone
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
        except Exception as exc:
            self.pending = batch + self.pending
            if (error := environmental(exc)) is None:
                raise
            delay = self.backoff.next()
            log.warning(
                "outcome write failed (%s); retrying %d outcomes in %.1fs", error, len(batch), delay
            )
            await asyncio.sleep(delay)
            return 0
        self.backoff.reset()
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

    def abandon(self, cause: BaseException) -> None:
        """The writer ended with a bug: fail every waiting execution instead of leaving
        it waiting forever, so the runner can hand its leases back and exit."""
        self.gone = cause
        pending, self.pending = self.pending, []
        for _report, future in pending:
            if not future.done():
                future.set_exception(ReporterGone())
