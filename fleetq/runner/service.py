"""The runner's composition root: its parts wired together, start-up and shutdown.

The parts, each owning its state: `Claimers` (`claimer`: a claim loop per lane, sized
by `policy`), `Runs` (`runs`: the executions), `Leases` (`leases`: the heartbeat, the
self-fence, stops, the collection pass), `Passes` (`passes`: the reaper and the
schedules of its lanes), `Control` (`control`: the LISTEN connection and the lock on
the runner id) and the `Reporter` (`reporter`: the outcome writer); what one asks of
another is passed in as hooks. Shutdown: stop claiming, let running jobs finish up to
the grace period, stop the rest and hand their leases back so they are requeued at
once, flush outcomes, and say offline.

Errors (`loops`): start-up waits for a database that is not there yet; every loop logs
a database error and tries again with backoff. Only a bug in fleetq ends a loop, and
then the runner shuts down at once the same way, leases handed back, exit status 70.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any

import asyncpg

from fleetq.core import fleet, queries
from fleetq.core.driver import AsyncpgDriver, Driver
from fleetq.core.errors import FleetqError
from fleetq.core.models import JobId, RunnerId, RunnerState
from fleetq.runner import loops, orphans, pidfile
from fleetq.runner.background import Background
from fleetq.runner.claimer import Claimers, RunnerHooks
from fleetq.runner.config import RunnerConfig
from fleetq.runner.control import Control, ControlHooks, Listener
from fleetq.runner.execution import Execution, Toolkit
from fleetq.runner.fencing import SELF_FENCE_CHECK_S
from fleetq.runner.jobuser import JobUsers, warn_shared_uid
from fleetq.runner.journal import Journal
from fleetq.runner.leases import LeaseHooks, Leases
from fleetq.runner.operations import Operations
from fleetq.runner.passes import Passes
from fleetq.runner.private import private_directory
from fleetq.runner.remote import ApiDriver, read_token
from fleetq.runner.reporter import Reporter
from fleetq.runner.runs import RunHooks, Runs
from fleetq.runner.sessions import Session, open_pool
from fleetq.runner.signals import dump_tasks
from fleetq.runner.staging import Staging
from fleetq.runner.startup import StartUp
from fleetq.runner.wakes import ApiControl

log = logging.getLogger("fleetq.runner.service")

# how long shutdown waits for the claim loops to see it (a claim has a 30 s client
# timeout; a loop stuck longer is cancelled)
CLAIMERS_STOP_S = 10.0

EXIT_BUG = 70  # EX_SOFTWARE: a bug in fleetq ended the runner (leases were handed back)


class RunnerService:
    """One fleetq-runner process: its parts composed, its lifecycle."""

    # the parts that need the database, made by `_serve`
    driver: Driver
    api: ApiDriver  # served through the API (`--api`)
    reporter: Reporter
    kit: Toolkit
    passes: Passes
    runs: Runs
    leases: Leases
    control: Control

    def __init__(self, config: RunnerConfig) -> None:
        self.config = config
        self.runner = RunnerId(config.runner_id)
        # checked before anything starts: a user that is missing or out of reach is a
        # configuration error, said at once
        self.job_users = JobUsers.configured(config.job_user, config.job_uids)
        if self.job_users is not None:
            self.job_users.prepare(config.directory() / "trees")
        else:
            warn_shared_uid()
        # the executions: only `Runs` adds or removes them; the other parts read them
        self.executions: dict[JobId, Execution] = {}
        self.state = RunnerState.ACTIVE
        self.shutdown_requested = asyncio.Event()
        self.immediate = False
        self.immediate_requested = asyncio.Event()
        self.done = asyncio.Event()
        self.exit_code = 0
        self.holder_gone = True  # set by run(): see pidfile
        self.background = Background(on_bug=self._bug)
        self.operations = Operations(lambda: self.driver)
        self.claimers = Claimers(
            config=config,
            runner=self.runner,
            stop=self.shutdown_requested,
            hooks=RunnerHooks(
                executions=lambda: self.executions,
                claiming=self._claiming,
                launch=lambda claim, lane, sent: self.runs.launch(claim, lane, sent),
                renew_sooner=lambda executions: self.leases.renew_sooner(executions),
            ),
        )
        self.claim_tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ---------------------------------------------------------------------

    def request_shutdown(self) -> None:
        """First call: graceful. Second call: stop running jobs now."""
        if self.shutdown_requested.is_set():
            self.immediate = True
            self.immediate_requested.set()
        self.shutdown_requested.set()
        self.claimers.wake_all()

    def task_labels(self) -> dict[asyncio.Task[Any], str]:
        """Each job's task, named by its job (for SIGUSR1's dump: job tasks are unnamed)."""
        return self.runs.task_labels() if hasattr(self, "runs") else {}

    async def run(self, dsn: str | None) -> int:
        """Serve until shut down, through `dsn`, or the API when configured (`dsn` is
        None then); returns the process exit status. Refused (`RunnerIdInUse`) while
        another process lives in this runner's directory."""
        directory = pidfile.take(self.config.directory(), self.runner)
        self.holder_gone = directory.predecessor is not None
        try:
            return await self._serve(dsn)
        finally:
            directory.release()

    async def _serve(self, dsn: str | None) -> int:
        if not orphans.become_subreaper():
            log.warning(
                "could not become a child subreaper: orphaned job processes would "
                "be reparented to init"
            )
        session: Session | None = None
        pool: asyncpg.Pool | None = None
        if dsn is not None:
            session = Session.for_dsn(dsn)
            pool = await open_pool(session, self.runner, lanes=len(self.config.lanes))
            self.driver = AsyncpgDriver(pool)
        else:
            assert self.config.api is not None and self.config.token_file is not None
            self.api = ApiDriver(
                self.config.api, read_token(self.config.token_file), ca_file=self.config.api_ca
            )
            self.driver = self.api
        try:
            self._compose(pool, session)
            listener = await StartUp(
                config=self.config,
                kit=self.kit,
                control=self.control,
                leases=self.leases,
                runs=self.runs,
                holder_gone=self.holder_gone,
                stop=self.shutdown_requested,
                follow_state=self._follow_state,
            ).run()
            if listener is None:
                log.info("shut down before the database answered")
                return 0
            self._serving()
            await self._loops(listener)
            return self.exit_code
        finally:
            await self.driver.close()

    def _compose(self, pool: asyncpg.Pool | None, session: Session | None) -> None:
        """The parts that need the database, each given what it asks of the others."""
        self.passes = Passes(
            driver=self.driver, runner=self.runner, reap_interval_s=self.config.reap_interval_s
        )
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
            retry_soon=self.passes.retry_soon,
            stopping=self.shutdown_requested,
            leaving=self.immediate_requested,
        )
        self.runs = Runs(
            kit=self.kit,
            executions=self.executions,
            stop=self.shutdown_requested,
            hooks=RunHooks(
                renew_sooner=lambda executions: self.leases.renew_sooner(executions),
                confirm=lambda ex, reason: self.leases.confirm(ex, reason),
                drain_self=lambda reason: self.leases.drain_self(reason),
                ended=self._ended,
            ),
        )
        self.leases = Leases(
            driver=self.driver,
            runner=self.runner,
            pool=pool,
            executions=self.executions,
            superseded=lambda: self.runs.superseded.values(),
            done=self.done,
            hooks=LeaseHooks(
                wake_lanes=self.claimers.wake_all,
                follow_state=self._follow_state,
                reread_config=lambda: self.background.coalesced("config", self._reread_config),
            ),
        )
        self.control = (ApiControl if session is None else Control)(
            session=session,
            config=self.config,
            runner=self.runner,
            driver=self.driver,
            wakes=self.claimers.wakes,
            done=self.done,
            background=self.background,
            hooks=ControlHooks(
                running_in=self.claimers.running_in,
                holds=self.executions,
                stop_lost=self.leases.stop_lost,
                reread_config=self._reread_config,
                follow_state=self._follow_state,
                displaced=self._displaced,
            ),
        )
        if isinstance(self.control, ApiControl):
            self.control.api = self.api

    async def _loops(self, listener: Listener) -> None:
        """Every loop of the runner, named, until shutdown is over."""
        reporter_stop = asyncio.Event()
        guard, leases, passes = self._guarded, self.leases, self.passes
        async with asyncio.TaskGroup() as tg:
            tg.create_task(guard("listener", self.control.listen(listener)), name="listener")
            self.claim_tasks = [
                tg.create_task(
                    guard(f"claim:{lane}", self.claimers.loop(lane, self.driver)), name=lane
                )
                for lane in self.config.lanes
            ]
            tg.create_task(guard("heartbeat", leases.heartbeats()), name="heartbeat")
            for name, interval, work in (
                ("schedules", lambda: self.config.reap_interval_s, passes.schedules_once),
                ("self-fence", lambda: SELF_FENCE_CHECK_S, leases.self_fence_once),
                ("collection", lambda: leases.lease_seconds, leases.strays_once),
            ):
                tg.create_task(guard(name, loops.every(interval, name, work, self.done)))
            reaps = loops.every(
                passes.reap_wait, "reap", passes.reap_once, self.done, passes.reap_wake
            )
            tg.create_task(guard("reap", reaps))
            tg.create_task(guard("reporter", self.reporter.run(reporter_stop)))
            await self._shutdown(reporter_stop)

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

    async def _reread_config(self) -> None:
        """The fleet's configuration changed (`fleetq apply` says so on fleetq_control;
        or this runner's LISTEN connection was away and may have missed it): read again
        what this runner keeps of it, the lease setting and offline threshold (its beat
        follows them from now) and the operations it runs (read again at their next
        launch). Caps, retries and the lease each claim or renewal grants are the
        database's own, read by every statement that uses them."""
        self.operations.forget()
        await self.leases.read_timing()  # wakes the beat: a renewal may be due sooner now

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
        log.info("shutting down: no new claims; %d running", len(self.runs.tasks))
        grace = 0.0 if self.immediate else self.config.grace_s
        if self.runs.tasks and grace:
            waiter = asyncio.ensure_future(self.immediate_requested.wait())
            running = asyncio.ensure_future(asyncio.wait(list(self.runs.tasks.values())))
            await asyncio.wait(
                [running, waiter], timeout=grace, return_when=asyncio.FIRST_COMPLETED
            )
            running.cancel()
            waiter.cancel()
        leftovers = list(self.executions.values())
        for ex in leftovers:
            ex.request_stop("shutdown")
        if self.runs.tasks or self.runs.superseded:
            await asyncio.wait([*self.runs.tasks.values(), *self.runs.superseded])
        held = [(ex.claim.job_id, ex.claim.lease_version, ex.end_seen) for ex in leftovers]
        if not self.leases.displaced:
            held += await self.leases.held_but_not_here({job for job, _, _ in held})
        await self.leases.release_all(held)
        if not self.leases.displaced:
            with contextlib.suppress(FleetqError):
                await self.leases.close_unrun_executions()
        reporter_stop.set()
        self.reporter.wake.set()
        if not self.leases.displaced:  # the row is the other process's now
            with contextlib.suppress(FleetqError):
                await fleet.set_state(
                    self.driver,
                    runner=self.runner,
                    state=RunnerState.OFFLINE,
                    reason="shut down",
                    actor=self.runner,
                )
        self.done.set()
        self.claimers.wake_all()

    # -- claiming ----------------------------------------------------------------------

    def _claiming(self) -> bool:
        return self.state == RunnerState.ACTIVE and not self.shutdown_requested.is_set()

    def _ended(self, ex: Execution) -> None:
        """A run ended: its lane looks again, and a draining runner it left idle says
        "drained" now, not at its next beat."""
        self.claimers.ended(ex)
        if self.state == RunnerState.DRAINING and not self.executions:
            self.background.spawn(self.leases.heartbeat_once())

    def _displaced(self) -> None:
        """Another process holds this runner id now: its leases and row are that
        process's, so shutdown neither releases them nor marks the runner offline."""
        self.leases.displaced = True
        self.exit_code = 1
        self.request_shutdown()

    async def _follow_state(self) -> None:
        """Follow the runner's own row: paused and draining stop claiming; drained exits
        when asked to (`--exit-when-drained`)."""
        rows = await self.driver.fetch(queries.sql("runners_get_state"), self.runner)
        before, self.state = self.state, RunnerState(rows[0]["state"])
        if before != self.state:
            log.info("runner state %s -> %s", before, self.state)
            self.claimers.wake_all()
        if self.state == RunnerState.DRAINED and self.config.exit_when_drained:
            log.info("drained; exiting as asked (--exit-when-drained)")
            self.request_shutdown()
