"""The runner's start-up: check the schema, take the runner id, register and settle what
an earlier process left, waiting for a database that cannot be reached yet. An attempt
cut off midway resumes where it stopped (`_Progress`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from fleetq import __version__
from fleetq.core import fleet, migrate
from fleetq.core.models import Registration
from fleetq.runner import loops
from fleetq.runner.collection import collect
from fleetq.runner.config import RunnerConfig
from fleetq.runner.control import Control, Listener, close_quietly
from fleetq.runner.execution import Toolkit
from fleetq.runner.leases import Leases
from fleetq.runner.runs import Runs

log = logging.getLogger("fleetq.runner.service")


@dataclass
class _Progress:
    """What start-up has done so far, kept between its attempts."""

    schema_checked: bool = False
    listener: Listener | None = None  # took the runner id's lock (checked on reuse)
    registered: bool = False  # under `listener`'s lock

    def steps(self) -> int:
        return self.schema_checked + (self.listener is not None) + self.registered

    async def abandon(self) -> None:
        if self.listener is not None:
            await close_quietly(self.listener)
            self.listener, self.registered = None, False


class StartUp:
    """Start-up's steps and what they need: the schema check, the LISTEN connection
    with the runner id's lock (`Control`), registration, and the collection of what an
    earlier process of this runner left (its leases, its runs to adopt, its trees)."""

    def __init__(
        self,
        *,
        config: RunnerConfig,
        kit: Toolkit,
        control: Control,
        leases: Leases,
        runs: Runs,
        holder_gone: bool,
        stop: asyncio.Event,
        follow_state: Callable[[], Awaitable[None]],
    ) -> None:
        self.config, self.kit, self.control = config, kit, control
        self.leases, self.runs, self.holder_gone = leases, runs, holder_gone
        self.stop, self.follow_state = stop, follow_state
        self.driver, self.runner = kit.driver, kit.runner

    async def run(self) -> Listener | None:
        """Check the schema, take the runner id, register and settle what an earlier
        process left; a database that cannot be reached yet is waited for, saying so.
        Returns the LISTEN connection (None: shut down while waiting).

        An attempt cut off midway resumes where it stopped, and one that got further
        than where it began retries at the first delay: on a lossy link (a reset every
        few dozen packets) start-up needs each step's round trips to get through, not
        all of its seventy at once, and a link that lets it on step by step is no reason
        to wait longer each time."""
        backoff = loops.Backoff()
        progress = _Progress()
        attempt: asyncio.Future[Listener] | None = None
        try:
            while not self.stop.is_set():
                before = progress.steps()
                # raced with shutdown: a connect to a black hole may take its whole timeout
                attempt = asyncio.ensure_future(self._once(progress))
                stop = asyncio.ensure_future(self.stop.wait())
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
                    await loops.wait_or(self.stop, delay)
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

    async def _once(self, progress: _Progress) -> Listener:
        """One attempt, from the first step not yet done (or undone since: a LISTEN
        connection that is gone took the runner id's lock with it, so registering comes
        again under the new one's). Collection runs whole every time: what it settled is
        settled in the database, and it reads the rest afresh."""
        if not progress.schema_checked:
            await migrate.require_current_async(self.driver)
            progress.schema_checked = True
        if progress.listener is not None and not await self.control.session_lives(
            progress.listener
        ):
            await progress.abandon()
        if progress.listener is None:
            progress.listener = await self.control.connect_listener()
        if not progress.registered:
            await self._register()
            progress.registered = True
        await self._collect()
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
            if (job, token) not in self.leases.inherited:
                log.warning(
                    "job=%d token=%d is held by this runner id, and nothing shows its holder "
                    "dead (no earlier process of this runner in %s): left to it, or to its "
                    "lease's expiry",
                    job,
                    token,
                    self.config.directory(),
                )
        self.leases.inherited = set(collected.left)
        for entry in collected.adopted:
            if entry.job_id not in self.runs.executions:  # not adopted by an earlier try
                await self.runs.adopt(entry)
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
        await self.leases.read_timing()
        await self.follow_state()
