"""One job's journey on this runner: prepare, run, hand the outcome to the reporter.

An `Execution` owns the local facts about a claimed job (its lease, its stop request,
its staged tree) so the heartbeat and the control listener can stop it, and the
claimer can count free slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import inspect
import logging
import os
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from fleetq.core import leasing
from fleetq.core.driver import Driver
from fleetq.core.errors import FleetqError, StaleLease
from fleetq.core.models import Claim, Outcome, OutcomeReport, RunnerId, StartReport
from fleetq.runner import executor, gate, handover, metrics, orphans, tracing
from fleetq.runner.context import JobContext
from fleetq.runner.jobuser import JobUser, JobUsers
from fleetq.runner.journal import Journal
from fleetq.runner.loops import Backoff, environmental, persist, transient, wait_or
from fleetq.runner.output import Shipper
from fleetq.runner.reporter import OutcomeNotRecorded, Reporter
from fleetq.runner.staging import CommitMissing, Staging, StagingFailed

log = logging.getLogger(__name__)


# runs of a handler under one lease when its database connection is cut (see _run_handler)
HANDLER_RUNS = 3
# how long a run's last output may take to ship before its outcome is written anyway
SHIP_FINAL_S = 5.0


@dataclass
class Operation:
    """What an operation runs (from the database)."""

    command: str | None
    handler: str | None
    timeout_s: int
    repository: str
    limits: executor.Limits = field(default_factory=lambda: executor.Limits())


@dataclass
class Execution:
    """A claimed job on this runner."""

    claim: Claim
    lane: str
    # the run's id, when it is already known (an adopted run's, from the journal); else
    # `run_id` makes one when first asked, which only a command's launch does (a
    # handler's execution gets an id of the database's, at its lease's end): a uuid4 per job
    # was a measurable share of a runner's CPU under a backlog
    known_run_id: uuid.UUID | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    stop_reason: str | None = None
    pid: int | None = None
    # monotonic time at which the lease was last known renewed (sent before the renewal,
    # so it errs early): self-fencing counts from here, never from the runner's wall clock
    renewed_at: float = field(default_factory=time.monotonic)
    # how long the lease was good for from `renewed_at`, as the database answered the
    # claim or renewal sent then (None: not answered; the runner's lease setting stands):
    # renewal and self-fence follow each lease's own length, whatever the settings say now
    lease_s: float | None = None

    hook: Callable[[], None] | None = None
    stop_unconfirmed: bool = False  # a stop was asked, but the process group survived it
    signal: int | None = None  # the signal that ended the process, recorded with a stop
    recorded: bool = False  # its outcome (or loss) is in the database
    stop_grace_s: float = executor.STOP_GRACE_S  # SIGTERM to SIGKILL when stopped
    start_resend: StartResend | None = None  # its start report, failed once, sent again
    ctx: JobContext | None = None  # a handler's context, while it runs
    trace: tracing.JobTrace | None = None  # its spans (no-ops unless tracing is on)
    # when its run was seen gone (`time.monotonic()`; see executor.Finished): the writes
    # that end it send it, so the database dates the end on its own clock
    ended_monotonic: float | None = None
    end_dated: bool = True  # False: seen gone only after the runner stalled (`stalls`)

    @property
    def end_seen(self) -> float | None:
        """When its run was seen gone, for the writes that end it: None when not seen, or
        seen only after a stall (then the database bounds the end by the write)."""
        return self.ended_monotonic if self.end_dated else None

    @property
    def run_id(self) -> uuid.UUID:
        """This run's id: the one it was adopted with, else one made now, once."""
        if self.known_run_id is None:
            self.known_run_id = uuid.uuid4()
        return self.known_run_id

    @property
    def traceparent(self) -> str | None:
        """The trace context to hand the job: its run span's when spans are on, else the
        one it was submitted with."""
        return self.trace.header() if self.trace else self.claim.traceparent

    def renewed(self, sent: float, left: float | None) -> None:
        """Its lease was renewed by a call sent at `sent` (`time.monotonic()`), with
        `left` seconds to run as the database answered."""
        self.renewed_at = sent
        if left is not None:
            self.lease_s = left

    @property
    def in_transaction(self) -> bool:
        """Whether its handler holds a `ctx.transaction()` (and so its job's row) now."""
        return self.ctx is not None and self.ctx.transactions_open > 0

    def request_stop(self, reason: str, *, grace_s: float | None = None) -> None:
        """Ask the execution to stop (it no longer holds its lease, or we shut down);
        `grace_s` shortens the time a command gets between SIGTERM and SIGKILL."""
        if grace_s is not None:
            self.stop_grace_s = min(self.stop_grace_s, grace_s)
        if self.stop_reason is None:
            self.stop_reason = reason
        self.stop.set()
        if self.hook is not None:
            self.hook()

    def on_stop(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call `hook` on a stop request (a running handler is cancelled this way)."""
        self.hook = hook
        return self._forget_hook

    def _forget_hook(self) -> None:
        self.hook = None


@dataclass
class StartResend:
    """A start report that failed once (a lost connection, a lock held past
    lock_timeout), sent again in the background while its run goes on.

    Why: a command's outcome records no execution (the start report writes it), so a run
    whose only start report failed was never on record: no execution with its node, pid
    and run id, the job never `running`, the run missing from the timeline and the
    overlap view."""

    report: StartReport
    task: asyncio.Task[None]
    ended: asyncio.Event  # set when the run's process is gone: an attempt at once


@dataclass
class Toolkit:
    """What executions need from the runner."""

    driver: Driver
    pool: asyncpg.Pool
    runner: RunnerId
    node: str
    staging: Staging
    reporter: Reporter
    logs: Path
    keep_failed: bool
    operation: Callable[[str, str], Awaitable[Operation | None]]
    journal: Journal
    adopt: bool = False  # --orphans adopt: commands run wrapped and outlive the runner
    job_users: JobUsers | None = None  # --job-uid-range: commands run as these uids
    # a retry may fall due in this many seconds: run a reaper pass then (it queues it)
    retry_soon: Callable[[float], None] = lambda _seconds: None
    # set when the runner shuts down: writes that retry until they land give up then
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # set when it must stop at once (a second SIGTERM): writes that a graceful shutdown
    # still waits for (outcomes, a run's start) give up then
    leaving: asyncio.Event = field(default_factory=asyncio.Event)


async def carry_out(ex: Execution, kit: Toolkit) -> None:
    """Run one claimed job to its recorded outcome (or to a confirmed stop)."""
    with tracing.JobTrace(ex.claim, kit.runner) as trace:
        ex.trace = trace
        await _carry_out(ex, kit, trace)


async def _carry_out(ex: Execution, kit: Toolkit, trace: tracing.JobTrace) -> None:
    claim = ex.claim
    op = await kit.operation(claim.project, claim.operation)
    if op is None:
        await _record(
            ex, kit, executor.Finished(Outcome.REFUSED, reason="operation not registered")
        )
        return
    if op.handler is not None:
        with trace.step("run"):
            finished = await _run_handler(ex, kit, op)
        await _record(ex, kit, finished)
        return
    await _carry_out_command(ex, kit, op, trace)


async def _carry_out_command(
    ex: Execution, kit: Toolkit, op: Operation, trace: tracing.JobTrace
) -> None:
    """A command job, under a uid of its own when the runner has job users: leased
    before its tree is staged, returned once nothing of it is left."""
    claim = ex.claim
    name = run_name(claim.job_id, claim.lease_version, ex.run_id)
    if kit.job_users is None:
        await _run_command(ex, kit, op, trace, name, None)
        return
    user = await kit.job_users.lease(ex.stop)
    if user is None:
        log.info(
            "not launching job=%d token=%d: stop requested while waiting for a job uid (%s)",
            claim.job_id,
            claim.lease_version,
            ex.stop_reason,
        )
        return
    try:
        await _run_command(ex, kit, op, trace, name, user)
    finally:
        # whatever ended the run (its end, a timeout, a stop, an error here): nothing of
        # it runs on under the uid the next job gets, nor can that job enter its tree
        await kit.job_users.give_back(user)
        await asyncio.to_thread(_reclaim, kit, kit.staging.trees / name)


async def _run_command(
    ex: Execution,
    kit: Toolkit,
    op: Operation,
    trace: tracing.JobTrace,
    name: str,
    user: JobUser | None,
) -> None:
    """Stage, launch (as `user` when given), follow and record one command job."""
    claim = ex.claim
    t0 = time.monotonic()
    try:
        with trace.step("stage"):
            tree = await kit.staging.stage(
                repository=op.repository, commit=claim.commit_sha, name=name
            )
    except CommitMissing as exc:
        await _record(ex, kit, executor.Finished(Outcome.REFUSED, reason=str(exc)))
        return
    except StagingFailed as exc:  # the fleet's failure, not the commit's: an error
        failed = executor.Finished(Outcome.FAILED, reason=f"staging failed: {exc}")
        await _record(ex, kit, failed)
        return
    user_env: dict[str, str] = {}
    if user is not None:
        user_env = user.environment(await asyncio.to_thread(_give, kit, tree, user))
    prepare_ms = int((time.monotonic() - t0) * 1000)
    if ex.stop.is_set():
        # cancelled, superseded or self-fenced while its tree was being staged: nothing
        # may run now (the stop is confirmed by the runner as for a running job)
        log.info(
            "not launching job=%d token=%d: stop requested while staging (%s)",
            claim.job_id,
            claim.lease_version,
            ex.stop_reason,
        )
        kit.staging.discard(tree)
        return
    opened = await gate.enter(kit.pool, kit.runner, claim)
    if isinstance(opened, str):
        # the database says no, though this runner has not heard why yet (a cancel whose
        # notification was lost): nothing runs, and the stop is confirmed as usual
        log.info("not launching job=%d token=%d: %s", claim.job_id, claim.lease_version, opened)
        ex.request_stop(opened)
        kit.staging.discard(tree)
        return
    try:
        await _launch(ex, kit, op, trace, (tree, name, user, user_env), prepare_ms, opened)
    finally:
        if opened is not None:
            await opened.close(commit=False)  # nothing launched: no start to commit


async def _launch(
    ex: Execution,
    kit: Toolkit,
    op: Operation,
    trace: tracing.JobTrace,
    staged: tuple[Path, str, JobUser | None, dict[str, str]],
    prepare_ms: int,
    opened: gate.Gate | None,
) -> None:
    """Launch a staged command (tree, run name, job user and its environment), follow it
    and record its outcome; its start report goes through the launch gate, when open."""
    claim = ex.claim
    tree, name, user, user_env = staged
    kit.journal.launching(claim.job_id, claim.lease_version, str(ex.run_id), str(tree))
    status_file = kit.logs / f"{name}.status" if kit.adopt else None
    log_path = kit.logs / f"{name}.log"
    ended = asyncio.Event()
    shipping = asyncio.create_task(Shipper(kit.driver, kit.runner, claim, log_path).run(ended))
    try:
        with trace.step("run"):
            finished = await executor.run_command(
                op.command or "",
                cwd=tree,
                # read inside the run's span: TRACEPARENT names it as the job's parent
                env=executor.job_environment(_job_env(ex, kit) | user_env),
                timeout_s=op.timeout_s,
                log_path=log_path,
                on_start=lambda pid, at: _report_start(ex, kit, pid, at, prepare_ms, opened),
                stop=ex.stop,
                status_file=status_file,
                stop_grace_s=lambda: ex.stop_grace_s,
                user=user,
                limits=op.limits,
            )
    finally:
        if opened is not None:
            # a launch that failed before its start report still holds the job's row:
            # the outcome below would wait on it (once closed, this is a no-op)
            await opened.close(commit=False)
        # what is left is shipped before the outcome (so `fleetq logs` ends with it),
        # but never holds the outcome up for long
        ended.set()
        if ex.start_resend is not None:  # at once, whatever ended the run
            ex.start_resend.ended.set()
        try:
            await asyncio.wait_for(shipping, SHIP_FINAL_S)
        except TimeoutError:
            log.warning("output of job=%d: the rest stays in %s", claim.job_id, log_path)
    await _record(ex, kit, finished, prepare_ms=prepare_ms)
    if finished.outcome is not None:
        kit.journal.ended(claim.job_id, claim.lease_version)
    if finished.outcome == Outcome.SUCCEEDED or not kit.keep_failed:
        kit.staging.discard(tree)


def _give(kit: Toolkit, tree: Path, user: JobUser) -> Path:
    """Hand a staged tree to its job's uid, with a fresh private home beside it (the
    job's HOME and TMPDIR); returns the home."""
    home = kit.staging.home_of(tree)
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(mode=0o700)
    handover.hand_over(home, user.uid, user.gid)
    handover.hand_over(tree, user.uid, user.gid)
    return home


def _reclaim(kit: Toolkit, tree: Path) -> None:
    """After its uid is returned: the job's home goes, and a tree kept (a failed run
    under --keep-failed, or one an error left) is the runner's again, closed."""
    shutil.rmtree(kit.staging.home_of(tree), ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        handover.take_back(tree)


async def _run_handler(ex: Execution, kit: Toolkit, op: Operation) -> executor.Finished:
    """Run a handler; one whose database connection was cut runs again in place, under
    the same lease, up to `HANDLER_RUNS` times, before its job is handed back.

    Why: a handler makes several round trips, each on a connection that may be new (and
    then makes more), so on a lossy link a run is cut far more often than a command is.
    Handing the job back at each cut spent the reassignment cap on the network (jobs
    failed `reassignments_exhausted` under 2% drops). Running it again here is what a
    new claim would do, minus the claim: handlers are at-least-once per lease already,
    and effects written with `transaction(finish=True)` commit at most once, because
    the lock on the job's row under this token fails once the outcome is in.
    """
    try:
        fn = _load_handler(op.handler or "")
    except Exception as exc:  # whatever its import raises: the job's to refuse, not ours
        return executor.Finished(Outcome.REFUSED, reason=f"handler {op.handler}: {exc}")
    c = ex.claim
    deadline = time.monotonic() + op.timeout_s
    backoff = Backoff()
    for run in range(1, HANDLER_RUNS + 1):
        ctx = ex.ctx = JobContext(
            claim=c,
            runner=kit.runner,
            pool=kit.pool,
            trace_header=ex.traceparent,
            renewed=ex.renewed,
        )
        left = deadline - time.monotonic()
        finished = await executor.run_handler(fn, ctx, timeout_s=left, stoppable=ex)
        if finished.lost is None or run == HANDLER_RUNS:
            return finished
        delay = backoff.next()
        if ex.stop.is_set() or time.monotonic() + delay >= deadline:
            return finished
        log.warning(
            "job=%d token=%d: %s; running it again in %.1fs (run %d of %d)",
            c.job_id,
            c.lease_version,
            finished.lost,
            delay,
            run + 1,
            HANDLER_RUNS,
        )
        metrics.HANDLER_RERUNS.inc()
        await wait_or(ex.stop, delay)
    raise AssertionError("unreachable")  # pragma: no cover


@functools.cache
def _load_handler(spec: str) -> Callable[..., Awaitable[Any]]:
    module, _, attr = spec.partition(":")
    fn = getattr(importlib.import_module(module), attr)  # once per spec (cached)
    if not inspect.iscoroutinefunction(fn):
        raise TypeError("a handler is an `async def` taking a JobContext")
    return fn  # type: ignore[no-any-return]


def _job_env(ex: Execution, kit: Toolkit) -> dict[str, str]:
    c = ex.claim
    env = {
        "FLEETQ_JOB_ID": str(c.job_id),
        "FLEETQ_FENCING_TOKEN": str(c.lease_version),
        "FLEETQ_RUN_ID": str(ex.run_id),
        "FLEETQ_PROJECT": c.project,
        "FLEETQ_OPERATION": c.operation,
        "FLEETQ_COMMIT": c.commit_sha,
        "FLEETQ_NODE": kit.node,
    }
    if trace := ex.traceparent:  # the W3C name, which tracing libraries read to continue
        env["TRACEPARENT"] = trace
    return env


async def _report_start(
    ex: Execution, kit: Toolkit, pid: int, at: Any, prepare_ms: int, opened: gate.Gate | None
) -> None:
    ex.pid = pid
    kit.journal.launched(
        ex.claim.job_id, ex.claim.lease_version, pid, at.timestamp(), orphans.birth(pid)
    )
    if os.environ.get("FLEETQ_TEST_HOLD_START_REPORT"):
        if opened is not None:
            await opened.close(commit=False)
        return  # test hook: the start report "never reaches" the database
    start = StartReport(
        job_id=ex.claim.job_id,
        lease_version=ex.claim.lease_version,
        node=kit.node,
        run_id=ex.run_id,
        pid=pid,
        process_started_at=at,
        prepare_ms=prepare_ms,
    )
    try:
        if opened is None:
            await _send_start(ex, kit, start, ended=None)
        else:  # in the gate's transaction, which holds the job's row until it commits
            try:
                await _send_start(ex, kit, start, ended=None, driver=opened.driver)
            finally:
                await opened.close(commit=True)
    except FleetqError as exc:
        # The lease is still ours until it expires, and the heartbeat will tell; the run
        # stays supervised. A transient failure is sent again until it lands; a restarted
        # runner adopts a run whose start report was lost (collection).
        if not transient(exc):
            log.warning("start report of job=%d refused: %s", ex.claim.job_id, exc)
            return
        log.warning("start report failed job=%d: %s; sending it again", ex.claim.job_id, exc)
        ended = asyncio.Event()
        ex.start_resend = StartResend(
            start, asyncio.create_task(_resend_start(ex, kit, start, ended)), ended
        )


async def _send_start(
    ex: Execution,
    kit: Toolkit,
    start: StartReport,
    *,
    ended: asyncio.Event | None,
    driver: Driver | None = None,
) -> None:
    """One start report. A stale lease stops a run that still runs (another holder has
    the job); a run that has ended by the answer (`ended` set) has nothing to stop, and
    its end's own write meets the same fence."""
    try:
        await leasing.report_start(driver or kit.driver, runner=kit.runner, start=start)
    except StaleLease:
        metrics.STALE.labels("start", "zombie").inc()
        if ended is not None and ended.is_set():
            log.info(
                "start of job=%d token=%d not recorded: the lease moved on before its run ended",
                start.job_id,
                start.lease_version,
            )
        else:
            ex.request_stop("stale")
        return
    metrics.STARTS.inc()
    if ex.trace is not None and start.pid is not None:
        ex.trace.event("started", pid=start.pid)
    log.info("started job=%d token=%d pid=%s", start.job_id, start.lease_version, start.pid)


async def _resend_start(
    ex: Execution, kit: Toolkit, start: StartReport, ended: asyncio.Event
) -> None:
    """Send a failed start report again, with backoff, until it lands, the lease turns
    out stale, the database refuses it for good, the run is stopped, or the runner must
    stop at once (a graceful shutdown lets runs end and writes their outcomes, so their
    starts too). When the run ends it is tried at once, and its end's write waits for
    it: that write needs what the start needs (the database, `executions`), so waiting
    costs it nothing, and a start sent after the outcome would be stale. Nothing here
    holds the job's row while it waits (report_start takes its tables first), so
    renewals go on."""
    backoff = Backoff()
    tried_after_end = False
    while True:
        if not ended.is_set():
            await _first_of((ended, ex.stop, kit.leaving), backoff.next())
        elif tried_after_end:
            await _first_of((ex.stop, kit.leaving), backoff.next())
        if ex.stop.is_set() or kit.leaving.is_set():
            why = ex.stop_reason if ex.stop.is_set() else "the runner stops at once"
            log.info("start of job=%d not recorded: %s", start.job_id, why)
            return
        tried_after_end = tried_after_end or ended.is_set()
        try:
            await _send_start(ex, kit, start, ended=ended)
            return
        except FleetqError as exc:
            if not transient(exc):
                log.warning("start of job=%d not recorded: %s", start.job_id, exc)
                return
            log.warning("start report failed again job=%d: %s", start.job_id, exc)


async def _first_of(events: tuple[asyncio.Event, ...], seconds: float) -> None:
    """Wait until any of `events` is set, or `seconds`."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def _retry_soon(kit: Toolkit) -> None:
    """A failed attempt may be retried after its backoff: a reaper pass then queues it,
    not the next pass of the reap interval. A question that fails changes nothing."""
    try:
        due = await leasing.next_retry_in(kit.driver)
    except Exception as exc:
        if environmental(exc) is None:
            raise
        return
    if due is not None:
        kit.retry_soon(due)


async def _record(
    ex: Execution, kit: Toolkit, finished: executor.Finished, prepare_ms: int | None = None
) -> None:
    c = ex.claim
    ex.signal = finished.signal
    ex.ended_monotonic = finished.ended_monotonic  # from now on the self-fence leaves it
    ex.end_dated = finished.end_dated
    if finished.reason == "stop-unconfirmed":
        ex.stop_unconfirmed = True
    if (resend := ex.start_resend) is not None:
        # the run on record before its end is written (the self-fence leaves an ended
        # run alone meanwhile)
        resend.ended.set()
        await resend.task
    if finished.lost is not None:
        await hand_back(ex, kit, finished.lost)
        return
    if finished.outcome is None:
        log.info("stopped job=%d token=%d reason=%s", c.job_id, c.lease_version, ex.stop_reason)
        return
    report = OutcomeReport(
        job_id=c.job_id,
        lease_version=c.lease_version,
        outcome=finished.outcome,
        exit_code=finished.exit_code,
        reason=finished.reason,
        log_tail=finished.log_tail,
        prepare_ms=prepare_ms,
        run_ms=finished.run_ms,
        ended_monotonic=ex.end_seen,
    )
    try:
        status = await kit.reporter.record(report)
        if finished.outcome == Outcome.FAILED:
            await _retry_soon(kit)
    except OutcomeNotRecorded as exc:
        log.error(
            "%s job=%d token=%d not recorded (%s); it runs again after its lease",
            finished.outcome,
            c.job_id,
            c.lease_version,
            exc,
        )
        return
    ex.recorded = True
    if ex.trace is not None:
        ex.trace.ended(finished.outcome, finished.exit_code, finished.reason)
    # handler jobs can run thousands a second: their success lines are debug (-v)
    level = logging.DEBUG if finished.exit_code == 0 and ex.pid is None else logging.INFO
    log.log(
        level,
        "%s job=%d token=%d exit=%s write=%s",
        finished.outcome,
        c.job_id,
        c.lease_version,
        finished.exit_code,
        status,
    )


async def hand_back(ex: Execution, kit: Toolkit, reason: str) -> None:
    """A run cut off by a transient failure (its database connection was lost): handed
    back at once, counted against the reassignment cap like an expiry, so a flaky
    network retries the job a few times rather than failing it, and never without end.
    A stale answer means the job had moved on (an outcome that did commit stands)."""
    c = ex.claim
    log.warning("job=%d token=%d cut off: %s", c.job_id, c.lease_version, reason)

    async def write() -> None:
        await release_counted(kit.driver, kit.runner, c, reason, ended_monotonic=ex.end_seen)
        ex.recorded = True

    await persist(f"hand-back of job={c.job_id}", write, kit.stopping)


async def release_counted(
    driver: Driver,
    runner: RunnerId,
    claim: Claim,
    reason: str,
    *,
    ended_monotonic: float | None = None,
) -> None:
    """Hand a lease back now, counted as a reassignment (so no job cycles for ever); a
    stale answer means the lease had moved on already, which is as good."""
    with contextlib.suppress(StaleLease):
        status = await leasing.release(
            driver,
            runner=runner,
            job_id=claim.job_id,
            token=claim.lease_version,
            reason=reason,
            fenced=True,
            ended_monotonic=ended_monotonic,
        )
        log.info("job=%d token=%d handed back: %s", claim.job_id, claim.lease_version, status)


def run_name(job_id: int, token: int, run_id: uuid.UUID) -> str:
    """The file name stem of an execution's tree, log and status file."""
    return f"{job_id}-{token}-{run_id.hex[:8]}"


def ran_for(pid: int, started_at: float) -> float:
    """How long an adopted run has run: from its process's start on the boot's clock, so
    a step of the wall clock since its launch (an NTP correction) neither kills it early
    as timed out nor lets it run over; by the wall clock only when the process is gone."""
    age = orphans.age(pid)
    return age if age is not None else time.time() - started_at


async def carry_on(ex: Execution, kit: Toolkit, *, started_at: float) -> None:
    """Follow an adopted run (launched by this runner before a restart) to its outcome."""
    claim = ex.claim
    assert ex.pid is not None
    name = run_name(claim.job_id, claim.lease_version, ex.run_id)
    remaining = claim.timeout_s - ran_for(ex.pid, started_at)
    finished = await executor.watch_adopted(
        ex.pid,
        status_file=kit.logs / f"{name}.status",
        log_path=kit.logs / f"{name}.log",
        timeout_s=remaining,
        stop=ex.stop,
        stop_grace_s=lambda: ex.stop_grace_s,
    )
    await _record(ex, kit, finished)
    if finished.outcome is not None:
        kit.journal.ended(claim.job_id, claim.lease_version)
