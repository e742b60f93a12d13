"""The runner's composition root: one TaskGroup of named loops around local executions.

Loops, each from its part: a claim loop per lane (`claimer`), the LISTEN connection
with the lock on the runner id (`control`), the heartbeat, the self-fence, the collection
and reaper passes and the schedules of its lanes (`keeping`), and the outcome writer
(`reporter`). This module holds
start-up, the executions' lifecycle and shutdown. Shutdown: stop claiming,
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
import math
import os
import time
import traceback
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from fleetq import __version__
from fleetq.core import fleet, leasing, migrate, queries, schedules
from fleetq.core.db import dsn_settings
from fleetq.core.driver import AsyncpgDriver, connect_each_host, prepare_asyncpg, server_guard
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
    Unusable,
)
from fleetq.runner import executor, identity, loops, orphans, pidfile
from fleetq.runner.base import log
from fleetq.runner.claimer import Claimers, RunnerHooks
from fleetq.runner.collection import collect
from fleetq.runner.config import RunnerConfig
from fleetq.runner.control import Control, close_quietly
from fleetq.runner.execution import (
    Execution,
    Toolkit,
    carry_on,
    carry_out,
    hand_back,
)
from fleetq.runner.fencing import SELF_FENCE_CHECK_S
from fleetq.runner.jobuser import JobUsers
from fleetq.runner.journal import Entry, Journal
from fleetq.runner.keeping import LeaseKeeping
from fleetq.runner.operations import Operations
from fleetq.runner.private import private_directory
from fleetq.runner.reporter import Reporter
from fleetq.runner.signals import dump_tasks
from fleetq.runner.staging import Staging

# how long shutdown waits for the claim loops to see it (a claim has a 30 s client
# timeout; a loop stuck longer is cancelled)
CLAIMERS_STOP_S = 10.0

# Runner sessions never hold a transaction or a lock for long (DESIGN: every call has a
# client timeout too, in the driver). Settings named in the DSN's query
# (`?lock_timeout=2000`) take precedence over these.
SESSION_SETTINGS = {
    "statement_timeout": "30000",
    "lock_timeout": "10000",
    "idle_in_transaction_session_timeout": "60000",
    "application_name": "fleetq-runner",
}
EXIT_BUG = 70  # EX_SOFTWARE: a bug in fleetq ended the runner (leases were handed back)


@dataclass
class _StartUp:
    """What start-up has done so far, kept between its attempts."""

    schema_checked: bool = False
    listener: asyncpg.Connection | None = None  # took the runner id's lock (checked on reuse)
    registered: bool = False  # under `listener`'s lock

    def steps(self) -> int:
        return self.schema_checked + (self.listener is not None) + self.registered

    async def abandon(self) -> None:
        if self.listener is not None:
            await close_quietly(self.listener)
            self.listener, self.registered = None, False


class RunnerService(LeaseKeeping, Control):
    """One fleetq-runner process: the parts composed, its lifecycle, its executions."""

    def __init__(self, config: RunnerConfig) -> None:
        self.config = config
        self.runner = RunnerId(config.runner_id)
        # checked before anything starts: a user that is missing or out of reach is a
        # configuration error, said at once
        self.job_users = JobUsers.configured(config.job_user, config.job_uids)
        if self.job_users is not None:
            self.job_users.prepare(config.directory() / "trees")
        else:
            _warn_shared_uid()
        self.executions: dict[JobId, Execution] = {}
        self.tasks: dict[JobId, asyncio.Task[None]] = {}
        self.state = RunnerState.ACTIVE
        self.shutdown_requested = asyncio.Event()
        self.claimers = Claimers(
            config=config,
            runner=self.runner,
            stop=self.shutdown_requested,
            hooks=RunnerHooks(
                executions=lambda: self.executions,
                claiming=self._claiming,
                launch=self._launch,
                renew_sooner=self._renew_sooner,
            ),
        )
        self.wakes = self.claimers.wakes
        self.beat_wake = asyncio.Event()
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
        self.inherited: set[tuple[JobId, FencingToken]] = set()
        self.holder_gone = True  # set by run(): see pidfile
        self.schedule_checks = schedules.MinuteChecks()  # when it next looks for due ticks
        self.reap_due = math.inf
        self.reap_wake = asyncio.Event()
        self.operations = Operations(lambda: self.driver)
        # runs replaced by this runner's own newer claim of their job, until they end
        # runs of this runner stopping because it claimed their job again: task -> (job, token)
        self._superseded: dict[asyncio.Task[None], tuple[JobId, FencingToken]] = {}
        self.claim_tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ---------------------------------------------------------------------

    def request_shutdown(self) -> None:
        """First call: graceful. Second call: stop running jobs now."""
        if self.shutdown_requested.is_set():
            self.immediate = True
            self.immediate_requested.set()
        self.shutdown_requested.set()
        self._wake_all()

    async def run(self, dsn: str) -> int:
        """Serve until shut down; returns the process exit status. Refused
        (`RunnerIdInUse`) while another process lives in this runner's directory."""
        directory = pidfile.take(self.config.directory(), self.runner)
        self.holder_gone = directory.predecessor is not None
        try:
            return await self._serve(dsn)
        finally:
            directory.release()

    async def _serve(self, dsn: str) -> int:
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
            connect=connect_each_host,
            min_size=0,
            max_size=4 + len(self.config.lanes),
            init=prepare_asyncpg,
            setup=server_guard(dsn),
            reset=_keep_session,
            server_settings={
                **self.session_settings,
                "application_name": identity.pool_application_name(self.runner, self._token),
            },
            timeout=10,  # to connect
        )
        self.driver = AsyncpgDriver(pool)
        self.reporter = Reporter(
            self.driver,
            self.runner,
            give_up=self.immediate_requested,
            refill_for=self.claimers.refill_for,
            refilled=self.claimers.refilled,
        )
        directory = self.config.directory()
        self.kit = Toolkit(
            driver=self.driver,
            pool=pool,
            runner=self.runner,
            node=self.config.node,
            staging=Staging(directory, isolated=self.job_users is not None),
            reporter=self.reporter,
            logs=private_directory(directory / "logs"),
            keep_failed=self.config.keep_failed,
            operation=self.operations.get,
            journal=Journal(directory / "journal.jsonl"),
            adopt=self.config.orphans == "adopt",
            job_users=self.job_users,
            retry_soon=self._retry_soon,
            stopping=self.shutdown_requested,
            leaving=self.immediate_requested,
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
                self.claim_tasks = [
                    tg.create_task(
                        guard(f"claim:{lane}", self.claimers.loop(lane, self.driver)), name=lane
                    )
                    for lane in self.config.lanes
                ]
                tg.create_task(guard("heartbeat", self._heartbeats()), name="heartbeat")
                for name, interval, work in (
                    ("schedules", lambda: self.config.reap_interval_s, self._schedules_once),
                    ("self-fence", lambda: SELF_FENCE_CHECK_S, self._self_fence_once),
                    ("collection", lambda: self.lease_seconds, self._strays_once),
                ):
                    tg.create_task(guard(name, loops.every(interval, name, work, self.done)))
                reaps = loops.every(
                    self._reap_wait, "reap", self._reap_once, self.done, self.reap_wake
                )
                tg.create_task(guard("reap", reaps))
                tg.create_task(guard("reporter", self.reporter.run(reporter_stop)))
                await self._shutdown(reporter_stop)
            return self.exit_code
        finally:
            await self.driver.close()

    async def _start_up(self) -> asyncpg.Connection | None:
        """Check the schema, take the runner id, register and settle what an earlier
        process left; a database that cannot be reached yet is waited for, saying so.
        Returns the LISTEN connection (None: shut down while waiting).

        An attempt cut off midway resumes where it stopped, and one that got further
        than where it began retries at the first delay: on a lossy link (a reset every
        few dozen packets) start-up needs each step's round trips to get through, not
        all of its seventy at once, and a link that lets it on step by step is no reason
        to wait longer each time."""
        backoff = loops.Backoff()
        progress = _StartUp()
        attempt: asyncio.Future[asyncpg.Connection] | None = None
        try:
            while not self.shutdown_requested.is_set():
                before = progress.steps()
                # raced with shutdown: a connect to a black hole may take its whole timeout
                attempt = asyncio.ensure_future(self._start_up_once(progress))
                stop = asyncio.ensure_future(self.shutdown_requested.wait())
                await asyncio.wait({attempt, stop}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                if not attempt.done():
                    return None  # shut down meanwhile (finally: the attempt is cancelled)
                try:
                    listener = attempt.result()
                except Exception as exc:
                    error = loops.environmental(exc)
                    if error is None or (error is exc and not loops.transient(error)):
                        raise  # a bug, or a refusal (schema, runner id in use): exit saying so
                    if not loops.transient(error):
                        raise error from exc  # e.g. bad credentials: say it and exit
                    if progress.steps() > before:
                        backoff.reset()
                    delay = backoff.next()
                    log.warning("waiting for the database (%s); retrying in %.1fs", error, delay)
                    await loops.wait_or(self.shutdown_requested, delay)
                    continue
                progress.listener = None  # handed over: not closed below
                return listener
            return None
        finally:
            if attempt is not None and not attempt.done():
                attempt.cancel()
                with contextlib.suppress(BaseException):
                    await attempt
            await progress.abandon()

    async def _start_up_once(self, progress: _StartUp) -> asyncpg.Connection:
        """One attempt, from the first step not yet done (or undone since: a LISTEN
        connection that is gone took the runner id's lock with it, so registering comes
        again under the new one's). Collection runs whole every time: what it settled is
        settled in the database, and it reads the rest afresh."""
        if not progress.schema_checked:
            await migrate.require_current_async(self.driver)
            progress.schema_checked = True
        if progress.listener is not None and not await self._session_lives(progress.listener):
            await progress.abandon()
        if progress.listener is None:
            progress.listener = await self._connect_listener()
        if not progress.registered:
            await self._register()
            progress.registered = True
        await self._collect()
        self._serving()
        return progress.listener

    async def _collect(self) -> None:
        collected = await collect(
            self.driver,
            self.runner,
            self.kit.journal,
            adopt=self.kit.adopt,
            holder_gone=self.holder_gone,
        )
        for job, token in collected.left:
            if (job, token) not in self.inherited:
                log.warning(
                    "job=%d token=%d is held by this runner id, and nothing shows its holder "
                    "dead (no earlier process of this runner in %s): left to it, or to its "
                    "lease's expiry",
                    job,
                    token,
                    self.config.directory(),
                )
        self.inherited = set(collected.left)
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
            self._bug(what, exc)

    def _bug(self, what: str, exc: Exception) -> None:
        """A bug ended `what`: stop every job at once, hand leases back, exit 70."""
        log.critical(
            "bug in fleetq: %s ended with %r; stopping every job, handing leases back and exiting",
            what,
            exc,
            exc_info=exc,
        )
        self.exit_code = EXIT_BUG
        if what == "reporter":
            self.reporter.abandon(exc)
        self.request_shutdown()
        self.request_shutdown()  # the second request stops running jobs at once

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
        await self._read_timing()
        await self._follow_state()

    async def _read_timing(self) -> None:
        """The lease setting and the offline threshold: the runner's beat follows both."""
        rows = await self.driver.fetch(queries.sql("runners_lease_seconds"))
        lease, offline = int(rows[0]["lease_seconds"]), int(rows[0]["offline_after_seconds"])
        if (lease, offline) != (self.lease_seconds, self.offline_after_seconds):
            log.info(
                "settings: lease %ds, offline after %ds (were %ds, %ds)",
                lease,
                offline,
                self.lease_seconds,
                self.offline_after_seconds,
            )
        self.lease_seconds, self.offline_after_seconds = lease, offline

    async def _reread_config(self) -> None:
        """The fleet's configuration changed (`fleetq apply` says so on fleetq_control;
        or this runner's LISTEN connection was away and may have missed it): read again
        what this runner keeps of it, the lease setting and offline threshold (its beat
        follows them from now) and the operations it runs (read again at their next
        launch). Caps, retries and the lease each claim or renewal grants are the
        database's own, read by every statement that uses them."""
        self.operations.forget()
        await self._read_timing()
        self.beat_wake.set()  # the next renewal may be due sooner now

    def _serving(self) -> None:
        """Said once start-up is complete (registered, and what an earlier process left
        settled): a tool waiting for this line may rely on it."""
        c = self.config
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
        # job this runner holds is either run to its end or handed back below. Bounded:
        # a claim stuck on a broken connection must not keep the runner from stopping
        # (what it took is found below as held but not running here, and handed back).
        _, stuck = await asyncio.wait(self.claim_tasks, timeout=CLAIMERS_STOP_S)
        if stuck:
            log.warning("claim loop(s) did not stop in %.0fs; cancelling them", CLAIMERS_STOP_S)
            dump_tasks(stuck)
            for task in stuck:
                task.cancel()
            await asyncio.wait(stuck)
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
        held = [(ex.claim.job_id, ex.claim.lease_version, ex.end_seen) for ex in leftovers]
        if not self.displaced:
            held += await self._held_but_not_here({job for job, _, _ in held})
        await self._release_all(held)
        if not self.displaced:
            with contextlib.suppress(FleetqError):
                await self._close_unrun_executions()
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

    async def _held_but_not_here(
        self, known: set[JobId]
    ) -> list[tuple[JobId, FencingToken, float | None]]:
        """Leases the database says this runner holds with nothing running here: a claim
        whose reply was lost, an outcome that could not be recorded. Handed back too."""
        try:
            rows = await self.driver.fetch(queries.sql("lease_held_by"), self.runner)
        except FleetqError:
            return []
        return [
            (JobId(r["job_id"]), FencingToken(r["lease_version"]), None)
            for r in rows
            if r["state"] in ("claimed", "running")
            and r["job_id"] not in known
            and (r["job_id"], r["lease_version"]) not in self.inherited
        ]

    async def _release_all(self, held: list[tuple[JobId, FencingToken, float | None]]) -> None:
        """Hand leases back (requeued at once, not counted as lost). With the database
        out of reach, the rest are left to expire rather than tried one by one."""
        for i, (job, token, ended) in enumerate(held):
            try:
                await leasing.release(
                    self.driver,
                    runner=self.runner,
                    job_id=job,
                    token=token,
                    reason="runner shutdown",
                    ended_monotonic=ended,
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
        return self.claimers.running_in(lane)

    def _launch(self, claim: Claim, lane: str, sent: float) -> None:
        ex = Execution(claim=claim, lane=lane, renewed_at=sent, lease_s=claim.lease_left_s)
        if (older := self.executions.get(claim.job_id)) is not None:
            # This runner claimed again a job it still runs under an older token (it was
            # frozen past its lease, e.g. SIGSTOP, and the job came back to the queue):
            # that run is superseded by our own newer claim. It stops and confirms as any
            # superseded run; the newer one takes its place here.
            older.request_stop("superseded")
            if (task := self.tasks.get(claim.job_id)) is not None:
                self._superseded[task] = (older.claim.job_id, older.claim.lease_version)
        self.executions[claim.job_id] = ex
        log.debug("claimed job=%d token=%d lane=%s", claim.job_id, claim.lease_version, lane)
        # unnamed: naming a task per job was 4% of a runner's busy CPU under a backlog;
        # SIGUSR1's dump names job tasks from self.tasks (task_labels)
        task = asyncio.create_task(self._execute(ex))
        self.tasks[claim.job_id] = task
        task.add_done_callback(functools.partial(self._finished, ex))

    def task_labels(self) -> dict[asyncio.Task[Any], str]:
        """Each job's task, named by its job (for SIGUSR1's dump: job tasks are unnamed),
        a superseded run's by its job and token."""
        labels = {task: f"job:{job_id}" for job_id, task in self.tasks.items()}
        for task, (job_id, token) in self._superseded.items():
            labels[task] = f"job:{job_id} token {token} (superseded)"
        return labels

    def _finished(self, ex: Execution, task: asyncio.Task[None]) -> None:
        job_id = ex.claim.job_id
        self._superseded.pop(task, None)
        if self.tasks.get(job_id) is task:  # not a newer execution of the same job
            self.executions.pop(job_id, None)
            self.tasks.pop(job_id, None)
        self.claimers.ended(ex)
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
        if ex.pid is not None:
            await executor.terminate_group(ex.pid, grace_s=executor.STOP_GRACE_S)
        ex.ended_monotonic = time.monotonic()
        if ex.recorded or ex.stop_reason is not None:
            return
        error = loops.environmental(exc)
        if error is not None and loops.transient(error):
            # the database went away under one of the execution's own calls (reading its
            # operation, reporting): not the job's failure, and not a bug
            await hand_back(ex, self.kit, f"database connection lost: {error}")
            return
        log.error("execution of job=%d failed inside the runner", c.job_id, exc_info=exc)
        report = OutcomeReport(
            job_id=c.job_id,
            lease_version=c.lease_version,
            outcome=Outcome.FAILED,
            reason=f"runner error: {type(exc).__name__}: {exc}"[:500],
            log_tail="".join(traceback.format_exception(exc))[-executor.TAIL_BYTES :],
            ended_monotonic=ex.ended_monotonic,
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
        sent = time.monotonic()  # its lease's clock, as a renewal's
        rows = await self.driver.fetch(queries.sql("lease_job"), self.runner, entry.job_id)
        if not rows:
            # its lease ended between the collection pass and now: the run may not go on
            await asyncio.to_thread(orphans.kill_run, entry.run_id)
            self.kit.journal.ended(entry.job_id, entry.token)
            log.warning("not adopting job=%d: its lease moved on; run killed", entry.job_id)
            return
        (row,) = rows
        claim = leasing.parse_claim({**row, "job_id": row["id"]})
        if isinstance(claim, Unusable):
            # a row no claim can use (its run began before the row went bad, or under a
            # version that read it otherwise): the run may not go on, and the job ends
            await asyncio.to_thread(orphans.kill_run, entry.run_id)
            await leasing.refuse(self.driver, runner=self.runner, unusable=[claim])
            self.kit.journal.ended(entry.job_id, entry.token)
            log.warning("refused job=%d token=%d: %s", claim.job_id, entry.token, claim.reason)
            return
        ex = Execution(
            claim=claim,
            lane=row["lane"],
            known_run_id=uuid.UUID(entry.run_id),
            pid=entry.pid,
            renewed_at=sent,
            lease_s=claim.lease_left_s,
        )
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
        self._renew_sooner([ex])
        task = asyncio.create_task(self._follow(ex, entry.started_at), name=f"job:{claim.job_id}")
        self.tasks[claim.job_id] = task
        task.add_done_callback(functools.partial(self._finished, ex))

    async def _follow(self, ex: Execution, started_at: float) -> None:
        try:
            await carry_on(ex, self.kit, started_at=started_at)
        except Exception as exc:
            await self._runner_error(ex, exc)
        await self._after_stop(ex)

    # -- leases, state, wake-ups -------------------------------------------------------


def _warn_shared_uid() -> None:
    """Without job users, command jobs run as the runner's own uid: say what that lets
    them read (root: everything)."""
    who = "root" if os.geteuid() == 0 else f"this runner's own uid ({os.geteuid()})"
    log.warning(
        "command jobs run as %s and can read what the runner reads, its credentials "
        "included (a passfile named in its DSN); to keep them out, run it as root with "
        "--job-uid-range",
        who,
    )


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """Nothing to reset (see RunnerService.run)."""
