"""Record: exactly one fenced outcome write per execution, batched.

Executions hand their outcome to the reporter and wait for the answer. The reporter
writes whatever is pending in one `complete` statement, so a runner finishing 64 jobs
makes one round trip, and an idle runner still writes a lone outcome at once. Any
database error (a lost connection, a lock held past `lock_timeout`, a statement timeout)
keeps the batch and retries it with backoff (an outcome that did commit answers
`already`, so a retry is safe); a stale answer is logged and counted, never retried.
An outcome whose job row another transaction holds (a cancel kept open) is answered
busy and written apart by a task of its own, so it never holds the batch up. That task
asks again at once, each call waiting its moment in the row's lock queue: when the
holder lets go, the outcome is queued on the row, ahead of a reaper that would expire
the lease (a holder may hold past it), as the blocking write it replaces was.

A batch may carry a claim for the room its outcomes free (`Refill`, asked of the runner
per batch): outcomes and claim are then one transaction instead of two, and where a
runner runs few jobs at once that is a commit per job less. The claim keeps its id
across the batch's retries, so a claim that committed is returned, not lost.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from fleetq.core import leasing
from fleetq.core.driver import Driver
from fleetq.core.errors import FleetqError
from fleetq.core.models import JobWrite, Outcome, OutcomeReport, RunnerId, WriteStatus
from fleetq.runner import metrics
from fleetq.runner.loops import Backoff, environmental, transient, wait_or

log = logging.getLogger(__name__)
MAX_BATCH = 256
HELD_WRITERS = 4  # busy outcomes written at once, each holding a pooled connection


class OutcomeNotRecorded(FleetqError):
    """The outcome could not be recorded (the runner is stopping with the database out of
    reach, the database refuses it for good, or the writer ended with a bug): the job's
    lease is left to expire and the job runs again."""


@dataclass(frozen=True)
class Refill:
    """A claim to make with a batch of outcomes, for the room they free."""

    lane: str
    limit: int
    claim_id: uuid.UUID
    sent: float  # monotonic time of the first send: the lease's clock (fencing)
    jobs: frozenset[int] = frozenset()  # the batch's jobs that ran in `lane`


RefillFor = Callable[[list[OutcomeReport]], "Refill | None"]
Refilled = Callable[[leasing.Claims, Refill], None]


class Reporter:
    """Batches outcome writes for one runner."""

    def __init__(
        self,
        driver: Driver,
        runner: RunnerId,
        give_up: asyncio.Event | None = None,
        *,
        refill_for: RefillFor | None = None,
        refilled: Refilled | None = None,
    ) -> None:
        self.driver = driver
        self.runner = runner
        self.refill_for = refill_for
        self.refilled = refilled
        self.refill: Refill | None = None  # the claim of the batch being written
        self.pending: list[tuple[OutcomeReport, asyncio.Future[WriteStatus]]] = []
        # busy outcomes (another transaction held their rows), each written by a task
        self.held: set[asyncio.Task[None]] = set()
        self.held_slots = asyncio.Semaphore(HELD_WRITERS)
        self.wake = asyncio.Event()
        self.backoff = Backoff()
        self.gone: BaseException | None = None
        # set when the runner must stop now (a second SIGTERM): outcomes that cannot be
        # written then are answered "not recorded" instead of retried for ever
        self.give_up = give_up or asyncio.Event()

    async def record(self, report: OutcomeReport) -> WriteStatus:
        """Queue one outcome and wait until it is written (or found stale)."""
        if self.gone is not None:
            raise OutcomeNotRecorded(f"the outcome writer ended: {self.gone!r}")
        future: asyncio.Future[WriteStatus] = asyncio.get_running_loop().create_future()
        self.pending.append((report, future))
        self.wake.set()
        return await future

    async def run(self, stop: asyncio.Event) -> None:
        """Write pending outcomes until stopped and nothing is pending or held."""
        while not (stop.is_set() and not self.pending and not self.held):
            if not self.pending:
                self.wake.clear()  # set by record(), and by each held write that ends
                waiters = {asyncio.ensure_future(self.wake.wait())}
                if not stop.is_set():
                    waiters.add(asyncio.ensure_future(stop.wait()))
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                for waiter in waiters:
                    waiter.cancel()
                continue
            await self.run_once()

    async def run_once(self) -> int:
        """Write one batch; returns how many outcomes it settled."""
        batch, self.pending = self.pending[:MAX_BATCH], self.pending[MAX_BATCH:]
        reports = [r for r, _ in batch]
        if self.refill is None and self.refill_for is not None:
            self.refill = self.refill_for(reports)
        try:
            answers = await self._write(reports, self.refill)
        except Exception as exc:
            error = environmental(exc)
            if error is None:
                self.pending = batch + self.pending
                raise
            if not transient(error):
                # one of them can never be stored: settle each on its own (the claim,
                # which may be what was refused, is left to the claim loop)
                self.refill = None
                return await self._one_by_one(batch, error)
            self.pending = batch + self.pending
            if self.give_up.is_set():
                self._answer_all(
                    f"the runner is stopping and the database is out of reach: {error}"
                )
                return 0
            delay = self.backoff.next()
            log.warning(
                "outcome write failed (%s); retrying %d outcomes in %.1fs", error, len(batch), delay
            )
            await wait_or(self.give_up, delay)
            return 0
        self.backoff.reset()
        self.refill = None
        # counted once per batch and outcome, not per job (a lock per increment)
        recorded: Counter[str] = Counter()
        busy = []
        for (report, future), answer in zip(batch, answers, strict=True):
            if answer.status == WriteStatus.BUSY:
                busy.append((report, future))
            elif self._settle(report, future, answer.status):
                recorded[report.outcome.value] += 1
        for outcome, n in recorded.items():
            metrics.outcome(outcome).inc(n)
        self._hold(busy)
        return len(batch) - len(busy)

    async def _write(
        self, reports: list[OutcomeReport], refill: Refill | None = None
    ) -> list[JobWrite]:
        if refill is None or self.refilled is None:
            return await leasing.complete_many(self.driver, runner=self.runner, outcomes=reports)
        answers, claims = await leasing.complete_and_claim(
            self.driver,
            runner=self.runner,
            outcomes=reports,
            lane=refill.lane,
            limit=refill.limit,
            claim_id=refill.claim_id,
        )
        self.refilled(claims, refill)
        return answers

    async def _one_by_one(
        self, batch: list[tuple[OutcomeReport, asyncio.Future[WriteStatus]]], error: FleetqError
    ) -> int:
        """A batch the database refused for good: write each outcome alone; one that is
        refused again is recorded as a failure that says why, without its output."""
        log.error("outcome batch of %d refused (%s); writing each alone", len(batch), error)
        for i, (report, future) in enumerate(batch):
            for attempt in (report, _failure_instead(report, error)):
                try:
                    (answer,) = await self._write([attempt])
                except Exception as exc:
                    again = environmental(exc)
                    if again is None:
                        self.pending = batch[i:] + self.pending
                        raise
                    if transient(again):
                        self.pending = batch[i:] + self.pending  # the rest: next round
                        return i
                    error = again
                    continue
                if answer.status == WriteStatus.BUSY:
                    self._hold([(report, future)])
                elif self._settle(attempt, future, answer.status):
                    metrics.outcome(attempt.outcome.value).inc()
                break
            else:
                log.error("outcome of job=%d cannot be recorded: %s", report.job_id, error)
                if not future.done():
                    future.set_exception(OutcomeNotRecorded(str(error)))
        return len(batch)

    def _hold(self, busy: list[tuple[OutcomeReport, asyncio.Future[WriteStatus]]]) -> None:
        """Write each busy outcome apart, by a task of its own."""
        for report, future in busy:
            log.warning(
                "outcome of job=%d waits: another transaction holds its row (a cancel, "
                "say); written apart from the other outcomes",
                report.job_id,
            )
            task = asyncio.ensure_future(self._write_held(report, future))
            self.held.add(task)
            task.add_done_callback(self._held_done)

    def _held_done(self, task: asyncio.Task[None]) -> None:
        self.held.discard(task)
        self.wake.set()  # run() may be waiting for the last of them
        if not task.cancelled() and task.exception() is not None:
            log.error("held outcome writer failed: %r", task.exception())

    async def _write_held(self, report: OutcomeReport, future: asyncio.Future[WriteStatus]) -> None:
        """Ask again until the row is free: each call waits its moment for the row
        (fleetq.lock_jobs), so no pause between calls is needed. A runner told to stop now
        answers it "not recorded" (its lease is left to expire)."""
        backoff = Backoff()
        async with self.held_slots:
            while not future.done():
                if self.give_up.is_set() or self.gone is not None:
                    future.set_exception(
                        OutcomeNotRecorded("the runner is stopping; its job's row is held")
                    )
                    return
                try:
                    (answer,) = await leasing.complete_many(
                        self.driver, runner=self.runner, outcomes=[report]
                    )
                except Exception as exc:
                    error = environmental(exc)
                    if error is None or not transient(error):
                        log.error("outcome of job=%d cannot be recorded: %s", report.job_id, exc)
                        future.set_exception(OutcomeNotRecorded(str(error or repr(exc))))
                        return
                    await wait_or(self.give_up, backoff.next())
                    continue
                backoff.reset()
                if answer.status != WriteStatus.BUSY and self._settle(
                    report, future, answer.status
                ):
                    metrics.outcome(report.outcome.value).inc()

    def _settle(
        self, report: OutcomeReport, future: asyncio.Future[WriteStatus], status: WriteStatus
    ) -> bool:
        """Answer the waiting execution; True when the outcome is recorded (the caller
        counts it), False when it was stale."""
        if not future.done():
            future.set_result(status)
        if status != WriteStatus.STALE:
            return True
        metrics.STALE.labels("outcome", "zombie").inc()
        log.warning(
            "outcome stale job=%d token=%d: the lease had moved on; not retried",
            report.job_id,
            report.lease_version,
        )
        return False

    def abandon(self, cause: BaseException) -> None:
        """The writer ended with a bug: answer every waiting execution instead of leaving
        it waiting forever, so the runner can hand its leases back and exit."""
        self.gone = cause
        self._answer_all(f"the outcome writer ended: {cause!r}")

    def _answer_all(self, why: str) -> None:
        pending, self.pending = self.pending, []
        for _report, future in pending:
            if not future.done():
                future.set_exception(OutcomeNotRecorded(why))


def _failure_instead(report: OutcomeReport, error: FleetqError) -> OutcomeReport:
    return report.model_copy(
        update={
            "outcome": Outcome.FAILED,
            "reason": f"outcome not recordable: {error}"[:500],
            "log_tail": "",
        }
    )
