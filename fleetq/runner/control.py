"""Control: the dedicated LISTEN connection (wake-ups per lane, operator actions on
jobs and on this runner), holding the lock on the runner id (`identity`), re-established
after a drop with every lane polling once, so a notification missed meanwhile costs
nothing."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable

import asyncpg

from fleetq.core import leasing
from fleetq.core.driver import ServerGuard, connect_each_host, mapped_errors, server_guard
from fleetq.core.models import JobId
from fleetq.runner import identity, loops
from fleetq.runner.base import RunnerBase, log

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


class Control(RunnerBase):
    """The LISTEN connection and the runner-id lock."""

    async def _connect_listener(self) -> asyncpg.Connection:
        """The dedicated LISTEN connection, holding the lock on this runner's id."""
        name = identity.application_name(self._token)
        # Keepalives: if this node dies, the server ends the session (and frees the
        # runner id) within about half a minute, not the kernel's two hours.
        settings = {**self.session_settings, **LISTEN_KEEPALIVES, "application_name": name}
        with mapped_errors():
            conn = await connect_each_host(
                self.dsn,
                timeout=10,
                server_settings={k: v for k, v in settings.items() if k not in self.dsn_names},
            )
        try:
            with mapped_errors():
                await identity.take(conn, self.runner, name)
                await identity.end_predecessors(
                    conn, self.runner, identity.pool_application_name(self.runner, self._token)
                )
        except BaseException:
            await close_quietly(conn)
            raise
        return conn

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
                    # a configuration change announced meanwhile went unheard
                    self._coalesced("config", self._reread_config)
                connects += 1
                self._wake_all()
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

    async def _watch(self, conn: asyncpg.Connection, lost: asyncio.Event) -> None:
        guard = server_guard(self.dsn)
        while not self.done.is_set() and not lost.is_set():
            stop = asyncio.ensure_future(self.done.wait())
            gone = asyncio.ensure_future(lost.wait())
            await asyncio.wait({stop, gone}, timeout=PING_S, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            gone.cancel()
            if not self.done.is_set() and not lost.is_set():
                await _probe(conn, guard)

    async def _session_lives(self, conn: asyncpg.Connection) -> bool:
        """Whether a LISTEN connection kept from an earlier attempt still holds the runner
        id's lock (start-up's reuse): a session the server ended (its keepalives, after a
        partition) still looks open here until something is sent."""
        if conn.is_closed():
            return False
        try:
            await _probe(conn, server_guard(self.dsn))
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
            if chosen and self._running_in(lane) >= self.config.lanes[lane]:
                announce = functools.partial(leasing.announce_lane, self.driver, lane)
                self._coalesced(f"announce {lane}", announce)
        elif lane not in self._lookouts:
            self._lookouts[lane] = asyncio.get_running_loop().call_later(
                min(self.config.poll_interval_s, LOOKOUT_S), self._look, lane
            )

    def _look(self, lane: str) -> None:
        self._lookouts.pop(lane, None)
        self.wakes[lane].set()

    @property
    def _lookouts(self) -> dict[str, asyncio.TimerHandle]:
        """Per lane, the pending look for a job announced to another runner."""
        if not hasattr(self, "_pending_looks"):
            self._pending_looks: dict[str, asyncio.TimerHandle] = {}
        return self._pending_looks

    def _on_control(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        """`runner:ID`, `job:N` and `config` are hints that any login can send (NOTIFY
        takes no privilege): each only makes this runner re-read the database, its state,
        the job's lease or the fleet's configuration (`fleetq apply` sends `config`), and
        an execution stops only when the database says its lease moved or its job was
        cancelled. A burst costs one read at a time, not one per notice."""
        kind, _, ident = str(payload).partition(":")
        if kind == "config" and not ident:
            self._coalesced("config", self._reread_config)
        elif kind == "runner" and ident == self.runner:
            self._coalesced("state", self._follow_state)
        elif kind == "job" and (job := job_named(ident)) is not None and job in self.executions:
            self._jobs_to_check.add(job)
            self._coalesced("jobs", self._check_jobs)

    async def _check_jobs(self) -> None:
        jobs, self._jobs_to_check = sorted(self._jobs_to_check), set()
        if jobs:
            await self._stop_lost(jobs)

    def _coalesced(self, key: str, action: Callable[[], Awaitable[None]]) -> None:
        """Run `action` now, or, if it is running, once more after it (what it read may
        predate the news): never two at once, however many notifications ask."""
        if key in self._in_flight:
            self._in_flight[key] = True
            return
        self._in_flight[key] = False
        self._spawn(self._run_coalesced(key, action))

    async def _run_coalesced(self, key: str, action: Callable[[], Awaitable[None]]) -> None:
        try:
            again = True
            while again:
                self._in_flight[key] = False
                await action()
                again = self._in_flight[key]
        finally:
            del self._in_flight[key]

    @property
    def _in_flight(self) -> dict[str, bool]:
        """Per coalesced action running now, whether it was asked for again meanwhile."""
        if not hasattr(self, "_coalescing"):
            self._coalescing: dict[str, bool] = {}
        return self._coalescing

    @property
    def _jobs_to_check(self) -> set[JobId]:
        """Jobs named by `job:N` hints and not yet re-read."""
        if not hasattr(self, "_hinted_jobs"):
            self._hinted_jobs: set[JobId] = set()
        return self._hinted_jobs

    @_jobs_to_check.setter
    def _jobs_to_check(self, jobs: set[JobId]) -> None:
        self._hinted_jobs = jobs


def _set_event(event: asyncio.Event, _conn: object) -> None:
    event.set()


async def close_quietly(conn: asyncpg.Connection) -> None:
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
