"""Following the database live: a dedicated LISTEN connection that turns notifications
into coalesced hints, with a slow resync as the safety net.

Events (claims, starts, outcomes...) send no NOTIFY: PostgreSQL commits notifying
transactions one at a time, and a NOTIFY from each serialized the queue. So the same
connection reads the newest event's id every `poll_s` (an index probe), and a new id is
a hint like a notification. Work and control changes (fleetq_work, fleetq_control) and
the watched job's output (fleetq_output) still notify.

On (re)connect it LISTENs first and only then asks for a full resync, so no change can
fall between the snapshot and the first notification. A notification is only a hint
(the payload is ignored): the app then reads new event rows by id and the visible
views. A lost connection is reported at once (the console shows "stale since") and
re-established with backoff; actions stay disabled until the resync after it lands.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import datetime

import asyncpg

from fleetq.console.messages import Health, Hint
from fleetq.core import queries
from fleetq.core.db import as_uri
from fleetq.core.driver import connect_each_host, mapped_errors, server_guard
from fleetq.core.errors import FleetqError

CHANNELS = ("fleetq_work", "fleetq_control")
# The safety net re-reads the views every `resync_s`, and the event tail whole only this
# often: new events are read by id with a look-back (reading.EVENT_LOOKBACK) for late
# commits, and a thousand events read and compared at each resync were most of an idle
# console's CPU. A whole read finds an event whose commit came later than the look-back.
EVENTS_RESYNC_S = 60.0
APPLICATION_NAME = "fleetq-console-listen"
log = logging.getLogger(__name__)


class Follower:
    """Run `follow()` as a worker; it posts `Hint` and `Health` through `post`."""

    def __init__(
        self,
        dsn: str,
        post: Callable[[Hint | Health], object],
        *,
        coalesce_s: float = 0.15,
        poll_s: float = 0.25,
        resync_s: float = 10.0,
        backoff_s: tuple[float, float] = (0.25, 5.0),
        watching: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.dsn = dsn
        self.post = post
        self.coalesce_s = coalesce_s
        self.poll_s = poll_s
        self.resync_s = resync_s
        self.backoff_s = backoff_s
        self.watching = watching  # the job whose output is on screen (fleetq_output)
        self.connected = asyncio.Event()

    async def follow(self) -> None:
        """Forever: connect, LISTEN, resync, then relay hints until the link breaks."""
        delay = self.backoff_s[0]
        while True:
            try:
                await self._session()
            except (FleetqError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                log.info("listen connection lost: %s", exc)
                self.post(Health(datetime.now().astimezone(), why=str(exc) or type(exc).__name__))
            if self.connected.is_set():
                delay = self.backoff_s[0]  # it had worked: the next outage starts afresh
            self.connected.clear()
            await asyncio.sleep(delay)  # backoff before reconnecting, not synchronisation
            delay = min(delay * 2, self.backoff_s[1])

    async def _session(self) -> None:
        woken = asyncio.Event()
        lost = asyncio.Event()
        guard = server_guard(self.dsn)
        with mapped_errors():
            conn = await connect_each_host(
                as_uri(self.dsn),
                timeout=10,
                server_settings={"application_name": APPLICATION_NAME},
            )
        waits: set[asyncio.Task[bool]] = set()
        try:
            conn.add_termination_listener(lambda _c: lost.set())
            for channel in CHANNELS:
                await conn.add_listener(channel, lambda *_args: woken.set())

            def output(_c: object, _pid: int, _channel: str, job: object) -> None:
                # a running job ships output every half second: only the one on screen
                # is worth a read
                if job == str(self.watching()):
                    woken.set()

            await conn.add_listener("fleetq_output", output)
            newest = await self._newest_event(conn)  # any event after it is news
            self.connected.set()
            self.post(Hint(resync=True))  # listening first, then the snapshot
            # The safety-net resync runs on its own clock: a steady stream of
            # notifications must not postpone it forever.
            resync_at = time.monotonic() + self.resync_s
            events_at = time.monotonic() + EVENTS_RESYNC_S
            poll_at = time.monotonic() + self.poll_s
            while True:
                waits = {asyncio.create_task(woken.wait()), asyncio.create_task(lost.wait())}
                await asyncio.wait(
                    waits,
                    timeout=max(0.0, min(resync_at, poll_at) - time.monotonic()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for task in waits:
                    task.cancel()
                if lost.is_set() or conn.is_closed():
                    raise FleetqError("the LISTEN connection was closed")
                if time.monotonic() >= poll_at:
                    if (now := await self._newest_event(conn)) != newest:
                        newest = now
                        woken.set()
                    poll_at = time.monotonic() + self.poll_s
                if time.monotonic() >= resync_at:
                    with mapped_errors():
                        await conn.fetchval("SELECT 1", timeout=5)  # a silent link may be dead
                    if guard is not None:
                        await guard(conn)  # a server fenced read-only hears no submit
                    woken.clear()
                    whole = time.monotonic() >= events_at
                    self.post(Hint(resync=whole))
                    resync_at = time.monotonic() + self.resync_s
                    if whole:
                        events_at = time.monotonic() + EVENTS_RESYNC_S
                elif woken.is_set():
                    await asyncio.sleep(self.coalesce_s)  # gather a burst into one read
                    woken.clear()
                    self.post(Hint())
        finally:
            for task in waits:
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 2)

    @staticmethod
    async def _newest_event(conn: asyncpg.Connection) -> int:
        with mapped_errors():
            return int(await conn.fetchval(queries.sql("views_newest_event"), timeout=5))
