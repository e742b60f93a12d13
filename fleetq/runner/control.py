"""Control: the dedicated LISTEN connection (wake-ups per lane, operator actions on
jobs and on this runner), holding the lock on the runner id (`identity`), re-established
after a drop with every lane polling once, so a notification missed meanwhile costs
nothing."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Container, Mapping
from dataclasses import dataclass
from typing import TypeAlias

import asyncpg

from fleetq.core import leasing
from fleetq.core.driver import (
    Driver,
    ServerGuard,
    connect_each_host,
    mapped_errors,
    server_guard,
)
from fleetq.core.models import JobId, RunnerId
from fleetq.runner import identity, loops
from fleetq.runner.background import Background
from fleetq.runner.config import RunnerConfig
from fleetq.runner.sessions import Session

log = logging.getLogger("fleetq.runner.service")

PING_S = 10.0
# A job announced to another runner is looked for this long after (once per lane, however
# many arrive meanwhile): what a job waits when the runner chosen for it died unseen.
LOOKOUT_S = 1.0
# If this node dies, the server ends the LISTEN session (and frees the runner id) within
# about half a minute, not the kernel's two hours.
LISTEN_KEEPALIVES = {
    "tcp_keepalives_idle": "10",
    "tcp_keepalives_interval": "5",
    "tcp_keepalives_count": "3",
}


class ApiListener:
    """What stands for the LISTEN connection of a runner served through the API
    (`wakes.ApiControl`): its wake-ups come from the gateway, by long poll."""

    async def close(self, timeout: float | None = None) -> None:
        """Nothing to close: each long poll is a request of its own."""

    def is_closed(self) -> bool:
        return False


Listener: TypeAlias = "asyncpg.Connection | ApiListener"


@dataclass(frozen=True)
class ControlHooks:
    """What the LISTEN connection's notices ask of the rest of the runner."""

    running_in: Callable[[str], int]  # this runner's executions in a lane
    holds: Container[JobId]  # jobs running here
    stop_lost: Callable[[list[JobId]], Awaitable[None]]  # re-read these leases, stop the lost
    reread_config: Callable[[], Awaitable[None]]  # `fleetq apply` changed the fleet
    follow_state: Callable[[], Awaitable[None]]  # an operator changed this runner's row
    displaced: Callable[[], None]  # another process took this runner id over


class Control:
    """The LISTEN connection and the runner-id lock."""

    def __init__(
        self,
        *,
        session: Session | None,
        config: RunnerConfig,
        runner: RunnerId,
        driver: Driver,
        wakes: Mapping[str, asyncio.Event],
        done: asyncio.Event,
        background: Background,
        hooks: ControlHooks,
    ) -> None:
        self.session, self.config, self.runner, self.driver = session, config, runner, driver
        self.wakes, self.done, self.background, self.hooks = wakes, done, background, hooks
        # per lane, the pending look for a job announced to another runner
        self._lookouts: dict[str, asyncio.TimerHandle] = {}
        self._jobs_to_check: set[JobId] = set()  # named by `job:N` hints, not yet re-read

    async def connect_listener(self) -> Listener:
        """The dedicated LISTEN connection, holding the lock on this runner's id."""
        assert self.session is not None, "a runner with a DSN has a session"
        name = identity.application_name(self.session.token)
        # Keepalives: if this node dies, the server ends the session (and frees the
        # runner id) within about half a minute, not the kernel's two hours.
        settings = {**self.session.settings, **LISTEN_KEEPALIVES, "application_name": name}
        with mapped_errors():
            conn = await connect_each_host(
                self.session.dsn,
                timeout=10,
                server_settings={
                    k: v for k, v in settings.items() if k not in self.session.dsn_names
                },
            )
        try:
            with mapped_errors():
                await identity.take(conn, self.runner, name)
                await identity.end_predecessors(
                    conn,
                    self.runner,
                    identity.pool_application_name(self.runner, self.session.token),
                )
        except BaseException:
            await close_quietly(conn)
            raise
        return conn

    async def listen(self, first: Listener) -> None:
        """The dedicated LISTEN connection (never pooled: a pool runs UNLISTEN * on
        release), re-established after a drop, with the runner id's lock taken again;
        after each (re)connect every lane polls once, so a notification missed meanwhile
        costs nothing."""
        assert isinstance(first, asyncpg.Connection), "a runner with a DSN listens itself"
        conn: asyncpg.Connection | None = first
        backoff = loops.Backoff()
        connects = 0
        while not self.done.is_set():
            if conn is None:
                try:
                    conn = await self._connect()
                except identity.RunnerIdInUse as exc:
                    self.displaced_by(exc)
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
                    # a configuration change announced meanwhile went unheard
                    self.background.coalesced("config", self.hooks.reread_config)
                connects += 1
                self._wake_lanes()
                await self._watch(conn, lost)
            except Exception as exc:
                if (error := loops.environmental(exc)) is None:
                    raise
                log.warning("LISTEN connection lost (%s); reconnecting", error)
            finally:
                await close_quietly(conn)
                conn = None
            if time.monotonic() - connected > PING_S:
                backoff.reset()  # it lived: the next drop is news, not a flapping server
            else:
                await backoff.sleep(self.done)  # gone at once: do not reconnect in a spin

    def displaced_by(self, exc: identity.RunnerIdInUse) -> None:
        """Another process holds this runner id now: this one stops, leaving it that."""
        log.critical("%s; shutting down (this process no longer owns it)", exc)
        self.hooks.displaced()

    async def _connect(self) -> asyncpg.Connection:
        conn = await self.connect_listener()
        assert isinstance(conn, asyncpg.Connection)
        return conn

    async def _watch(self, conn: asyncpg.Connection, lost: asyncio.Event) -> None:
        assert self.session is not None
        guard = server_guard(self.session.dsn)
        while not self.done.is_set() and not lost.is_set():
            stop = asyncio.ensure_future(self.done.wait())
            gone = asyncio.ensure_future(lost.wait())
            await asyncio.wait({stop, gone}, timeout=PING_S, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            gone.cancel()
            if not self.done.is_set() and not lost.is_set():
                await _probe(conn, guard)

    async def session_lives(self, conn: Listener) -> bool:
        """Whether a LISTEN connection kept from an earlier attempt still holds the runner
        id's lock (start-up's reuse): a session the server ended (its keepalives, after a
        partition) still looks open here until something is sent."""
        assert self.session is not None and isinstance(conn, asyncpg.Connection)
        if conn.is_closed():
            return False
        try:
            await _probe(conn, server_guard(self.session.dsn))
        except Exception as exc:
            if loops.environmental(exc) is None:
                raise
            return False
        return True

    def _on_work(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        """A wake-up names a lane, or a lane and the one runner chosen to claim a new job
        (`fleetq.announce_job`). Another runner's job is looked for once, LOOKOUT_S later
        (or a poll interval, if shorter): the chosen runner may have died before claiming
        it. A job named for this runner while its lane is full is announced to the whole
        lane."""
        lane, _, chosen = str(payload).partition(" ")
        wake = self.wakes.get(lane)
        if wake is None:
            return
        if not chosen or chosen == self.runner:
            wake.set()
            if chosen and self.hooks.running_in(lane) >= self.config.lanes[lane]:
                announce = functools.partial(leasing.announce_lane, self.driver, lane)
                self.background.coalesced(f"announce {lane}", announce)
        elif lane not in self._lookouts:
            self._lookouts[lane] = asyncio.get_running_loop().call_later(
                min(self.config.poll_interval_s, LOOKOUT_S), self._look, lane
            )

    def _look(self, lane: str) -> None:
        self._lookouts.pop(lane, None)
        self.wakes[lane].set()

    def _on_control(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        """`runner:ID`, `job:N` and `config` are hints that any login can send (NOTIFY
        takes no privilege): each only makes this runner re-read the database, its state,
        the job's lease or the fleet's configuration (`fleetq apply` sends `config`), and
        an execution stops only when the database says its lease moved or its job was
        cancelled. A burst costs one read at a time, not one per notice."""
        kind, _, ident = str(payload).partition(":")
        if kind == "config" and not ident:
            self.background.coalesced("config", self.hooks.reread_config)
        elif kind == "runner" and ident == self.runner:
            self.background.coalesced("state", self.hooks.follow_state)
        elif kind == "job" and (job := job_named(ident)) is not None and job in self.hooks.holds:
            self._jobs_to_check.add(job)
            self.background.coalesced("jobs", self._check_jobs)

    def _wake_lanes(self) -> None:
        for wake in self.wakes.values():
            wake.set()

    async def _check_jobs(self) -> None:
        jobs, self._jobs_to_check = sorted(self._jobs_to_check), set()
        if jobs:
            await self.hooks.stop_lost(jobs)


def _set_event(event: asyncio.Event, _conn: object) -> None:
    event.set()


async def close_quietly(conn: Listener) -> None:
    with contextlib.suppress(Exception):
        await conn.close(timeout=2)


async def _probe(conn: asyncpg.Connection, guard: ServerGuard | None) -> None:
    """One round trip on a LISTEN connection: a silent network drop shows here. A server
    demoted or fenced read-only stays reachable but hears no submit (the new primary's
    NOTIFYs go to its own listeners only): the guard refuses it."""
    await conn.fetchval("SELECT 1", timeout=5)
    if guard is not None:
        await guard(conn)


def job_named(ident: str) -> JobId | None:
    """The job a `job:N` hint names: ASCII digits that fit a bigint, else None. Any login
    may NOTIFY: `job:²` passed `isdigit` and `int()` raised on it, as on 5,000 digits,
    in the listener's callback (a traceback in the runner's log per notice)."""
    if not (ident.isascii() and ident.isdigit()) or len(ident) > 19:
        return None
    job = int(ident)
    return JobId(job) if 0 < job < 2**63 else None
