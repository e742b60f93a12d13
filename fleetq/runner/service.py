"""The runner's composition root: one TaskGroup of named loops around local executions.

Loops: a claim loop per lane (a long `checks` job never delays a `control` operation),
the LISTEN connection (wake-ups, operator control, and the lock on the runner id), the
heartbeat (leases and liveness, and following the runner's own row), the reporter
(batched outcomes) and a reaper pass (one leader fleet-wide). Shutdown: stop claiming,
let running jobs finish up to the grace period, stop the rest and hand their leases back
so they are requeued at once, flush outcomes, and say offline.

Errors (`loops`): start-up waits for a database that is not there yet; every loop logs
a database error and tries again with backoff. Only a bug in fleetq ends a loop, and
then the runner shuts down at once the same way, leases handed back, exit status 70.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from fleetq import __version__
from fleetq.core import fleet, leasing, migrate, queries
from fleetq.core.db import dsn_settings
from fleetq.core.driver import AsyncpgDriver, mapped_errors, prepare_asyncpg
from fleetq.core.errors import FleetqError, StaleLease
from fleetq.core.models import (
    Claim,
    FencingToken,
    JobId,
    Outcome,
    OutcomeReport,
    Registration,
    RunnerId,
    RunnerState,
    StartReport,
    WriteStatus,
)
from fleetq.runner import executor, identity, loops, metrics, orphans
from fleetq.runner.collection import collect
from fleetq.runner.config import RunnerConfig
from fleetq.runner.execution import Execution, Operation, Toolkit, carry_on, carry_out
from fleetq.runner.fencing import SELF_FENCE_CHECK_S, FenceRule
from fleetq.runner.journal import Entry, Journal
from fleetq.runner.reporter import Reporter
from fleetq.runner.staging import Staging

log = logging.getLogger(__name__)

# Runner sessions never hold a transaction or a lock for long (DESIGN: every call has a
# client timeout too, in the driver). Settings named in the DSN's query
# (`?lock_timeout=2000`) take precedence over these.
SESSION_SETTINGS = {
    "statement_timeout": "30000",
    "lock_timeout": "10000",
    "idle_in_transaction_session_timeout": "60000",
    "application_name": "fleetq-runner",
}
LISTEN_KEEPALIVES = {
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
}
PING_S = 10.0
EXIT_BUG = 70  # EX_SOFTWARE: a bug in fleetq ended the runner (leases were handed back)


class RunnerService:
    """One fleetq-runner process."""

    def __init__(self, config: RunnerConfig) -> None:
        self.config = config
        self.runner = RunnerId(config.runner_id)
        self.executions: dict[JobId, Execution] = {}
        self.tasks: dict[JobId, asyncio.Task[None]] = {}
        self.wakes = {lane: asyncio.Event() for lane in config.lanes}
        self.state = RunnerState.ACTIVE
        self.shutdown_requested = asyncio.Event()
        self.immediate = False
        self.immediate_requested = asyncio.Event()
        self.done = asyncio.Event()
        self.lease_seconds = 30
        self.offline_after_seconds = 30
        self.exit_code = 0
        self._token = identity.new_token()
        # another process took this runner id over (our LISTEN session was gone for a
        # while): its leases are not ours to report lost, release or mark offline
        self.displaced = False
        self._operations: dict[tuple[str, str], Operation] = {}
        # runs replaced by this runner's own newer claim of their job, until they end
        self._superseded: set[asyncio.Task[None]] = set()
        self.claimers: list[asyncio.Task[None]] = []
        self._slot_gauges = {lane: metrics.SLOTS_IN_USE.labels(lane) for lane in config.lanes}

    # -- lifecycle ---------------------------------------------------------------------

    def request_shutdown(self) -> None:
        """First call: graceful. Second call: stop running jobs now."""
        if self.shutdown_requested.is_set():
            self.immediate = True
            self.immediate_requested.set()
        self.shutdown_requested.set()
        self._wake_all()

    async def run(self, dsn: str) -> int:
        """Serve until shut down; returns the process exit status."""
        if not orphans.become_subreaper():
            log.warning(
                "could not become a child subreaper: orphaned job processes would "
                "be reparented to init"
            )
        self.dsn = dsn
        self.dsn_names = dsn_settings(dsn)
        self.session_settings = {
            k: v for k, v in SESSION_SETTINGS.items() if k not in self.dsn_names
        }
        # min_size=0: creating the pool connects nothing, so a database that is not there
        # yet shows up in start-up's first statement, which waits for it.
        # reset=_keep_session: the runner's pooled sessions never LISTEN, SET or hold
        # session locks, so asyncpg's reset on release (a round trip per call) is waste.
        pool = await asyncpg.create_pool(
            dsn,
            min_size=0,
            max_size=4 + len(self.config.lanes),
            init=prepare_asyncpg,
            reset=_keep_session,
            server_settings=self.session_settings,
            timeout=10,  # to connect
        )
        self.driver = AsyncpgDriver(pool)
        self.reporter = Reporter(self.driver, self.runner, give_up=self.immediate_requested)
        directory = self.config.directory()
        self.kit = Toolkit(
            driver=self.driver,
            pool=pool,
            runner=self.runner,
            node=self.config.node,
            staging=Staging(directory),
            reporter=self.reporter,
            logs=directory / "logs",
            keep_failed=self.config.keep_failed,
            operation=self._operation,
            journal=Journal(directory / "journal.jsonl"),
            adopt=self.config.orphans == "adopt",
            stopping=self.shutdown_requested,
        )
        try:
            listener = await self._start_up()
            if listener is None:
                log.info("shut down before the database answered")
                return 0
            reporter_stop = asyncio.Event()
            guard = self._guarded
            async with asyncio.TaskGroup() as tg:
                tg.create_task(guard("listener", self._listen(listener)), name="listener")
                self.claimers = [
                    tg.create_task(guard(f"claim:{lane}", self._claim_loop(lane)), name=lane)
                    for lane in self.config.lanes
                ]
                for name, interval, work in (
                    ("heartbeat", self._beat_s, self._heartbeat_once),
                    ("reap", lambda: self.config.reap_interval_s, self._reap_once),
                    ("self-fence", lambda: SELF_FENCE_CHECK_S, self._self_fence_once),
                    ("collection", lambda: self.lease_seconds, self._strays_once),
                ):
                    tg.create_task(guard(name, loops.every(interval, name, work, self.done)))
                tg.create_task(guard("reporter", self.reporter.run(reporter_stop)))
                await self._shutdown(reporter_stop)
            return self.exit_code
        finally:
            await self.driver.close()

    async def _start_up(self) -> asyncpg.Connection | None:
        """Check the schema, take the runner id, register and settle what an earlier
        process left; a database that cannot be reached yet is waited for, saying so.
        Returns the LISTEN connection (None: shut down while waiting)."""
        backoff = loops.Backoff()
        while not self.shutdown_requested.is_set():
            # raced with shutdown: a connect to a black hole may take its whole timeout
            attempt = asyncio.ensure_future(self._start_up_once())
            stop = asyncio.ensure_future(self.shutdown_requested.wait())
            await asyncio.wait({attempt, stop}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if not attempt.done():
                attempt.cancel()
                with contextlib.suppress(BaseException):
                    await attempt
                return None
            try:
                return attempt.result()
            except Exception as exc:
                error = loops.environmental(exc)
                if error is None or (error is exc and not loops.transient(error)):
                    raise  # a bug, or a refusal (schema, runner id in use): exit saying so
                if not loops.transient(error):
                    raise error from exc  # e.g. bad credentials: say it and exit
                delay = backoff.next()
                log.warning("waiting for the database (%s); retrying in %.1fs", error, delay)
                await loops.wait_or(self.shutdown_requested, delay)
        return None

    async def _start_up_once(self) -> asyncpg.Connection:
        listener: asyncpg.Connection | None = None
        try:
            await migrate.require_current_async(self.driver)
            listener = await self._connect_listener()
            await self._register()
            await self._collect()
        except BaseException:
            if listener is not None:
                await _close_quietly(listener)
            raise
        return listener

    async def _connect_listener(self) -> asyncpg.Connection:
        """The dedicated LISTEN connection, holding the lock on this runner's id."""
        name = identity.application_name(self._token)
        # Keepalives: if this node dies, the server ends the session (and frees the
        # runner id) within about half a minute, not the kernel's two hours.
        settings = {**self.session_settings, **LISTEN_KEEPALIVES, "application_name": name}
        with mapped_errors():
            conn = await asyncpg.connect(
                self.dsn,
                timeout=10,
                server_settings={k: v for k, v in settings.items() if k not in self.dsn_names},
            )
        try:
            with mapped_errors():
                await identity.take(conn, self.runner, name)
        except BaseException:
            await _close_quietly(conn)
            raise
        return conn

    async def _collect(self) -> None:
        collected = await collect(self.driver, self.runner, self.kit.journal, adopt=self.kit.adopt)
        for entry in collected.adopted:
            if entry.job_id not in self.executions:  # not adopted by an earlier try
                await self._adopt(entry)
        keep = {Path(e.tree) for e in collected.adopted if e.tree}
        if swept := await asyncio.to_thread(self.kit.staging.sweep, keep):
            log.info("removed %d staged trees left by an earlier process", len(swept))
        if collected.lost or collected.stops_confirmed or collected.superseded_closed:
            log.info(
                "collection pass: %d reported lost, %d stops confirmed, %d superseded "
                "executions closed",
                collected.lost,
                collected.stops_confirmed,
                collected.superseded_closed,
            )

    async def _guarded(self, what: str, work: Awaitable[None]) -> None:
        """Run one loop; a bug that ends it ends the runner, leases handed back first."""
        try:
            await work
        except Exception as exc:
            log.critical(
                "bug in fleetq: %s ended with %r; stopping every job, handing leases back "
                "and exiting",
                what,
                exc,
                exc_info=exc,
            )
            self.exit_code = EXIT_BUG
            if what == "reporter":
                self.reporter.abandon(exc)
            self.request_shutdown()
            self.request_shutdown()  # the second request stops running jobs at once

    def _beat_s(self) -> float:
        """Renew often enough for the lease and for the offline threshold alike."""
        return max(0.2, min(self.lease_seconds, self.offline_after_seconds) / 3)

    async def _register(self) -> None:
        c = self.config
        await fleet.register(
            self.driver,
            Registration(
                node=c.node,
                name=c.name,
                capabilities=c.capabilities,
                memory_mb=c.memory_mb,
                cpu_millis=c.cpu_millis,
                lanes=dict(c.lanes),
                version=__version__,
                pid=os.getpid(),
            ),
        )
        rows = await self.driver.fetch(queries.sql("runners_lease_seconds"))
        self.lease_seconds = int(rows[0]["lease_seconds"])
        self.offline_after_seconds = int(rows[0]["offline_after_seconds"])
        await self._follow_state()
        lanes = " ".join(f"{lane}={slots}" for lane, slots in sorted(c.lanes.items()))
        log.info(
            "runner %s serving %s capabilities=%s memory_mb=%d cpus=%g state=%s",
            self.runner,
            lanes,
            ",".join(c.capabilities) or "-",
            c.memory_mb,
            c.cpus,
            self.state,
        )

    async def _shutdown(self, reporter_stop: asyncio.Event) -> None:
        await self.shutdown_requested.wait()
        # A claim in flight may still commit: let the claim loops finish first, so every
        # job this runner holds is either run to its end or handed back below.
        await asyncio.wait(self.claimers)
        log.info("shutting down: no new claims; %d running", len(self.tasks))
        grace = 0.0 if self.immediate else self.config.grace_s
        if self.tasks and grace:
            waiter = asyncio.ensure_future(self.immediate_requested.wait())
            running = asyncio.ensure_future(asyncio.wait(list(self.tasks.values())))
            await asyncio.wait(
                [running, waiter], timeout=grace, return_when=asyncio.FIRST_COMPLETED
            )
            running.cancel()
            waiter.cancel()
        leftovers = list(self.executions.values())
        for ex in leftovers:
            ex.request_stop("shutdown")
        if self.tasks or self._superseded:
            await asyncio.wait([*self.tasks.values(), *self._superseded])
        held = [(ex.claim.job_id, ex.claim.lease_version) for ex in leftovers]
        if not self.displaced:
            held += await self._held_but_not_here({job for job, _ in held})
        await self._release_all(held)
        reporter_stop.set()
        self.reporter.wake.set()
        if not self.displaced:  # the row is the other process's now
            with contextlib.suppress(FleetqError):
                await fleet.set_state(
                    self.driver,
                    runner=self.runner,
                    state=RunnerState.OFFLINE,
                    reason="shut down",
                    actor=self.runner,
                )
        self.done.set()
        self._wake_all()

    async def _held_but_not_here(self, known: set[JobId]) -> list[tuple[JobId, FencingToken]]:
        """Leases the database says this runner holds with nothing running here: a claim
        whose reply was lost, an outcome that could not be recorded. Handed back too."""
        try:
            rows = await self.driver.fetch(queries.sql("lease_held_by"), self.runner)
        except FleetqError:
            return []
        return [
            (JobId(r["job_id"]), FencingToken(r["lease_version"]))
            for r in rows
            if r["state"] in ("claimed", "running") and r["job_id"] not in known
        ]

    async def _release_all(self, held: list[tuple[JobId, FencingToken]]) -> None:
        """Hand leases back (requeued at once, not counted as lost). With the database
        out of reach, the rest are left to expire rather than tried one by one."""
        for i, (job, token) in enumerate(held):
            try:
                await leasing.release(
                    self.driver,
                    runner=self.runner,
                    job_id=job,
                    token=token,
                    reason="runner shutdown",
                )
                log.info("released job=%d token=%d (requeued)", job, token)
            except StaleLease:
                continue
            except FleetqError as exc:
                if not loops.transient(exc):
                    log.warning("could not release job=%d token=%d: %s", job, token, exc)
                    continue
                log.warning(
                    "database out of reach (%s): %d lease(s) left to expire", exc, len(held) - i
                )
                return

    # -- claiming ----------------------------------------------------------------------

    def _claiming(self) -> bool:
        return self.state == RunnerState.ACTIVE and not self.shutdown_requested.is_set()

    def _running_in(self, lane: str) -> int:
        return sum(1 for ex in self.executions.values() if ex.lane == lane)

    async def _claim_loop(self, lane: str) -> None:
        wake = self.wakes[lane]
        claim_id = uuid.uuid4()
        sent: float | None = None  # when this claim id was first sent: its lease's clock
        backoff = loops.Backoff()
        while not self.shutdown_requested.is_set():
            wake.clear()  # before claiming: a hint that arrives meanwhile is not lost
            free = self.config.lanes[lane] - self._running_in(lane)
            if self._claiming() and free > 0:
                limit = min(self.config.batch, free)
                if sent is None:
                    sent = time.monotonic()
                try:
                    claims = await leasing.claim(
                        self.driver, runner=self.runner, lane=lane, limit=limit, claim_id=claim_id
                    )
                except Exception as exc:
                    if (error := loops.environmental(exc)) is None:
                        raise
                    # same claim id on retry: a claim that committed is returned, not lost
                    delay = await backoff.sleep(self.shutdown_requested)
                    log.warning(
                        "claim failed lane=%s (%s); retried after %.1fs", lane, error, delay
                    )
                    continue
                backoff.reset()
                claim_id, claimed_at, sent = uuid.uuid4(), sent, None
                metrics.CLAIMS.labels(lane).inc(len(claims))
                for c in claims:
                    self._launch(c, lane, claimed_at)
                if claims and time.monotonic() - claimed_at > self._beat_s():
                    # a retried claim's lease dates from its first send: renew it now
                    # rather than let the self-fence stop a run that just began
                    self._spawn(self._heartbeat_once())
                if len(claims) == limit:
                    continue  # there may be more right behind
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self.config.poll_interval_s)

    def _launch(self, claim: Claim, lane: str, sent: float) -> None:
        ex = Execution(claim=claim, lane=lane, renewed_at=sent)
        if (older := self.executions.get(claim.job_id)) is not None:
            # This runner claimed again a job it still runs under an older token (it was
            # frozen past its lease, e.g. SIGSTOP, and the job came back to the queue):
            # that run is superseded by our own newer claim. It stops and confirms as any
            # superseded run; the newer one takes its place here.
            older.request_stop("superseded")
            if (task := self.tasks.get(claim.job_id)) is not None:
                self._superseded.add(task)
        self.executions[claim.job_id] = ex
        self._slot_gauges[lane].inc()
        log.debug("claimed job=%d token=%d lane=%s", claim.job_id, claim.lease_version, lane)
        task = asyncio.create_task(self._execute(ex), name=f"job:{claim.job_id}")
        self.tasks[claim.job_id] = task
        task.add_done_callback(functools.partial(self._finished, claim.job_id, lane))

    def _finished(self, job_id: JobId, lane: str, task: asyncio.Task[None]) -> None:
        self._superseded.discard(task)
        if self.tasks.get(job_id) is task:  # not a newer execution of the same job
            self.executions.pop(job_id, None)
            self.tasks.pop(job_id, None)
        self._slot_gauges[lane].dec()
        self.wakes[lane].set()
        if self.state == RunnerState.DRAINING and not self.executions:
            self._spawn(self._heartbeat_once())  # say "drained" now, not at the next beat

    async def _execute(self, ex: Execution) -> None:
        try:
            await carry_out(ex, self.kit)
        except Exception as exc:
            await self._runner_error(ex, exc)
        await self._after_stop(ex)

    async def _runner_error(self, ex: Execution, exc: Exception) -> None:
        """An execution ended by fleetq itself, not by its job: kill whatever it launched
        and record an outcome that says why, so the job neither runs unwatched nor holds
        a slot until its lease runs out."""
        c = ex.claim
        log.error("execution of job=%d failed inside the runner", c.job_id, exc_info=exc)
        if ex.pid is not None:
            await executor.terminate_group(ex.pid, grace_s=executor.STOP_GRACE_S)
        if ex.recorded or ex.stop_reason is not None:
            return
        report = OutcomeReport(
            job_id=c.job_id,
            lease_version=c.lease_version,
            outcome=Outcome.FAILED,
            reason=f"runner error: {type(exc).__name__}: {exc}"[:500],
            log_tail="".join(traceback.format_exception(exc))[-executor.TAIL_BYTES :],
        )
        with contextlib.suppress(FleetqError):
            await self.reporter.record(report)

    async def _after_stop(self, ex: Execution) -> None:
        """Record a stop this runner made (cancel, lease lost, self-fenced)."""
        if ex.stop_unconfirmed:
            reason = f"stop-unconfirmed: job {ex.claim.job_id}"
            log.error("%s: its process group survived SIGKILL; draining this runner", reason)
            await loops.persist(reason, lambda: self._drain_self(reason), self.shutdown_requested)
            return  # not confirmed, so the job keeps showing "stop pending"
        if ex.stop_reason in ("cancelled", "superseded", "stale", "self_fenced"):
            reason = "superseded" if ex.stop_reason == "stale" else ex.stop_reason
            await loops.persist(
                f"stop of job={ex.claim.job_id}",
                lambda: self._confirm(ex, reason),
                self.shutdown_requested,
            )
        if ex.stop_reason is not None:
            self.kit.journal.ended(ex.claim.job_id, ex.claim.lease_version)

    async def _adopt(self, entry: Entry) -> None:
        """Take over a run launched before a restart: report its start if that was lost,
        then follow it to its outcome like any other execution."""
        (row,) = await self.driver.fetch(queries.sql("jobs_get"), entry.job_id)
        claim = Claim.model_validate({**row, "job_id": row["id"]})
        ex = Execution(claim=claim, lane=row["lane"], run_id=uuid.UUID(entry.run_id), pid=entry.pid)
        assert entry.pid is not None and entry.started_at is not None
        if row["state"] == "claimed":
            await leasing.report_start(
                self.driver,
                runner=self.runner,
                start=StartReport(
                    job_id=claim.job_id,
                    lease_version=claim.lease_version,
                    node=self.config.node,
                    run_id=ex.run_id,
                    pid=entry.pid,
                    process_started_at=datetime.fromtimestamp(entry.started_at, UTC),
                ),
            )
        log.warning(
            "adopted job=%d token=%d pid=%d run=%s",
            claim.job_id,
            claim.lease_version,
            entry.pid,
            entry.run_id,
        )
        self.executions[claim.job_id] = ex
        self._slot_gauges[ex.lane].inc()
        task = asyncio.create_task(self._follow(ex, entry.started_at), name=f"job:{claim.job_id}")
        self.tasks[claim.job_id] = task
        task.add_done_callback(functools.partial(self._finished, claim.job_id, ex.lane))

    async def _follow(self, ex: Execution, started_at: float) -> None:
        try:
            await carry_on(ex, self.kit, started_at=started_at)
        except Exception as exc:
            await self._runner_error(ex, exc)
        await self._after_stop(ex)

    async def _drain_self(self, reason: str) -> None:
        await fleet.set_state(
            self.driver,
            runner=self.runner,
            state=RunnerState.DRAINING,
            reason=reason,
            actor=self.runner,
        )

    async def _confirm(self, ex: Execution, reason: str) -> None:
        c = ex.claim
        if reason == "self_fenced":
            # Fenced blind (the database was unreachable); now that it answers, say what
            # really happened meanwhile: superseded or cancelled wins over self_fenced.
            (row,) = await self.driver.fetch(queries.sql("lease_job_states"), [c.job_id])
            if row["state"] == "cancelled":
                reason = "cancelled"
            elif row["lease_version"] != c.lease_version:
                reason = "superseded"
        await leasing.confirm_stop(
            self.driver,
            runner=self.runner,
            job_id=c.job_id,
            token=c.lease_version,
            signal=ex.signal,
            reason=reason,
        )
        log.info("stop confirmed job=%d token=%d reason=%s", c.job_id, c.lease_version, reason)
        if reason == "self_fenced":
            # If the lease is somehow still ours (only our connection was cut), hand it
            # back so the job runs again now rather than at expiry.
            # Counted as a reassignment: a job cannot cycle through self-fences for ever.
            with contextlib.suppress(StaleLease):
                status = await leasing.release(
                    self.driver,
                    runner=self.runner,
                    job_id=c.job_id,
                    token=c.lease_version,
                    reason="self-fenced",
                    fenced=True,
                )
                log.info(
                    "self-fenced job=%d token=%d handed back: %s", c.job_id, c.lease_version, status
                )

    async def _strays_once(self) -> None:
        """The periodic collection pass: what the database says this runner holds but
        nothing here runs (say, a claim whose reply was lost for good) is settled now
        rather than at lease expiry. Claims younger than a lease are left alone: their
        answer may still be on its way to the claim loop."""
        if self.displaced:
            return
        for row in await self.driver.fetch(queries.sql("lease_held_by"), self.runner):
            job = JobId(row["job_id"])
            if job in self.executions or (row["held_s"] or 0) < self.lease_seconds:
                continue
            token = FencingToken(row["lease_version"])
            if row["state"] == "cancelled":
                await leasing.confirm_stop(
                    self.driver,
                    runner=self.runner,
                    job_id=job,
                    token=token,
                    signal=None,
                    reason="cancelled",
                )
                continue
            with contextlib.suppress(StaleLease):
                status = await leasing.report_lost(
                    self.driver,
                    runner=self.runner,
                    job_id=job,
                    token=token,
                    reason="held but not running",
                )
                log.warning(
                    "stray job=%d token=%d held but not running here: %s", job, token, status
                )

    async def _self_fence_once(self) -> None:
        """Stop executions whose lease may expire unrenewed (the database is out of
        reach) so that the stop, SIGKILL included, is over before the database could
        expire the lease: the rule and its budget are in `fencing`."""
        rule = FenceRule(self.lease_seconds)
        now = time.monotonic()
        for ex in list(self.executions.values()):
            if ex.stop_reason is None and rule.due(ex.renewed_at, now):
                log.warning(
                    "self-fencing job=%d token=%d: lease not renewed for %.1fs (the database "
                    "could expire it in %.1fs)",
                    ex.claim.job_id,
                    ex.claim.lease_version,
                    now - ex.renewed_at,
                    self.lease_seconds - (now - ex.renewed_at),
                )
                ex.request_stop("self_fenced", grace_s=rule.grace_s)

    async def _operation(self, project: str, name: str) -> Operation | None:
        if (project, name) not in self._operations:
            rows = await self.driver.fetch(queries.sql("lease_operations"))
            self._operations = {
                (r["project"], r["operation"]): Operation(
                    command=r["command"],
                    handler=r["handler"],
                    timeout_s=r["timeout_s"],
                    repository=r["repository"],
                )
                for r in rows
            }
        return self._operations.get((project, name))

    # -- leases, state, wake-ups -------------------------------------------------------

    async def _heartbeat_once(self) -> None:
        leases = [(j, ex.claim.lease_version) for j, ex in self.executions.items()]
        sent = time.monotonic()
        answers = await leasing.heartbeat(self.driver, runner=self.runner, leases=leases)
        metrics.HEARTBEAT_LAG.set(time.monotonic() - sent)
        for answer in answers:
            if (ex := self.executions.get(answer.job_id)) is None:
                continue
            if answer.status == WriteStatus.OK or (
                # its row is locked by this run's own handler transaction: nobody can take
                # the lease while it is (claims take queued jobs; the reaper skips it)
                answer.status == WriteStatus.BUSY and ex.in_transaction
            ):
                ex.renewed_at = sent
        stale = [a.job_id for a in answers if a.status == "stale"]
        metrics.STALE.labels("heartbeat").inc(len(stale))
        if stale:
            await self._stop_lost(stale)
        await self._follow_state()

    async def _stop_lost(self, job_ids: list[JobId]) -> None:
        """Stop local executions whose lease this runner no longer holds."""
        rows = await self.driver.fetch(queries.sql("lease_job_states"), job_ids)
        for row in rows:
            ex = self.executions.get(row["job_id"])
            if ex is None:
                continue
            held = (
                row["lease_owner"] == self.runner
                and row["lease_version"] == ex.claim.lease_version
                and row["state"] in ("claimed", "running")
            )
            if not held:
                reason = "cancelled" if row["state"] == "cancelled" else "superseded"
                log.info(
                    "stopping job=%d token=%d: %s", ex.claim.job_id, ex.claim.lease_version, reason
                )
                ex.request_stop(reason)

    async def _follow_state(self) -> None:
        rows = await self.driver.fetch(queries.sql("runners_get_state"), self.runner)
        before, self.state = self.state, RunnerState(rows[0]["state"])
        if before != self.state:
            log.info("runner state %s -> %s", before, self.state)
            self._wake_all()
        if self.state == RunnerState.DRAINED and self.config.exit_when_drained:
            log.info("drained; exiting as asked (--exit-when-drained)")
            self.request_shutdown()

    async def _reap_once(self) -> None:
        result = await leasing.reap(self.driver)
        if result.requeued or result.failed:
            log.info(
                "reaped expired leases: %d requeued, %d failed", result.requeued, result.failed
            )

    def _wake_all(self) -> None:
        for wake in self.wakes.values():
            wake.set()

    async def _listen(self, first: asyncpg.Connection) -> None:
        """The dedicated LISTEN connection (never pooled: a pool runs UNLISTEN * on
        release), re-established after a drop, with the runner id's lock taken again;
        after each (re)connect every lane polls once, so a notification missed meanwhile
        costs nothing."""
        conn: asyncpg.Connection | None = first
        backoff = loops.Backoff()
        connects = 0
        while not self.done.is_set():
            if conn is None:
                try:
                    conn = await self._connect_listener()
                except identity.RunnerIdInUse as exc:
                    log.critical("%s; shutting down (this process no longer owns it)", exc)
                    self.exit_code = 1
                    self.displaced = True
                    self.request_shutdown()
                    return
                except Exception as exc:
                    if (error := loops.environmental(exc)) is None:
                        raise
                    delay = await backoff.sleep(self.done)
                    log.warning("LISTEN connection failed (%s); retried after %.1fs", error, delay)
                    continue
            lost = asyncio.Event()
            connected = time.monotonic()
            try:
                conn.add_termination_listener(functools.partial(_set_event, lost))
                await conn.add_listener("fleetq_work", self._on_work)
                await conn.add_listener("fleetq_control", self._on_control)
                if connects:
                    log.info("LISTEN connection re-established; polling once")
                connects += 1
                self._wake_all()
                await self._watch(conn, lost)
            except Exception as exc:
                if (error := loops.environmental(exc)) is None:
                    raise
                log.warning("LISTEN connection lost (%s); reconnecting", error)
            finally:
                await _close_quietly(conn)
                conn = None
            if time.monotonic() - connected > PING_S:
                backoff.reset()  # it lived: the next drop is news, not a flapping server
            else:
                await backoff.sleep(self.done)  # gone at once: do not reconnect in a spin

    async def _watch(self, conn: asyncpg.Connection, lost: asyncio.Event) -> None:
        while not self.done.is_set() and not lost.is_set():
            stop = asyncio.ensure_future(self.done.wait())
            gone = asyncio.ensure_future(lost.wait())
            await asyncio.wait({stop, gone}, timeout=PING_S, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            gone.cancel()
            if not self.done.is_set() and not lost.is_set():
                await conn.fetchval("SELECT 1", timeout=5)  # a silent network drop shows here

    def _on_work(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        wake = self.wakes.get(str(payload))
        if wake is not None:
            wake.set()

    def _on_control(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        kind, _, ident = str(payload).partition(":")
        if kind == "runner" and ident == self.runner:
            self._spawn(self._follow_state())
        elif kind == "job" and ident.isdigit() and JobId(int(ident)) in self.executions:
            self._spawn(self._stop_lost([JobId(int(ident))]))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(self._quietly(coro))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _quietly(self, coro: Any) -> None:
        try:
            await coro
        except Exception as exc:
            if (error := loops.environmental(exc)) is None:
                await self._guarded("a control action", _reraise(exc))
                return
            log.warning("control action failed: %s", error)

    @property
    def _background(self) -> set[asyncio.Task[None]]:
        if not hasattr(self, "_bg"):
            self._bg: set[asyncio.Task[None]] = set()
        return self._bg


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """Nothing to reset (see RunnerService.run)."""


def _set_event(event: asyncio.Event, _conn: object) -> None:
    event.set()


async def _close_quietly(conn: asyncpg.Connection) -> None:
    with contextlib.suppress(Exception):
        await conn.close(timeout=2)


async def _reraise(exc: BaseException) -> None:
    raise exc


def install_signals(service: RunnerService, add: Callable[[int, Callable[[], None]], None]) -> None:
    """SIGTERM/SIGINT: graceful shutdown; a second one stops running jobs at once."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        add(sig, service.request_shutdown)
