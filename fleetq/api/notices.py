"""One LISTEN connection per API process, its notices fanned out to every runner that
long-polls (`GET /v1/runner/wake`), instead of a LISTEN session per runner.

Notices are hints (any login may NOTIFY): a runner only reads the database again because
of one. So missing some is allowed if it is said: a cursor names this process's epoch
and a sequence number; a cursor of another epoch (another process behind the load
balancer, or this one after its LISTEN connection came back) or older than what is kept
answers `gap`, and the runner looks at every lane and re-reads its configuration, as a
direct runner does after its LISTEN connection comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections import deque

import asyncpg

from fleetq.api.models import Notice, Wake
from fleetq.core.db import as_uri
from fleetq.core.driver import connect_each_host, mapped_errors
from fleetq.core.errors import FleetqError

log = logging.getLogger("fleetq.api")

CHANNELS = ("fleetq_work", "fleetq_control")
KEEP = 4096  # notices kept for runners between two polls
MAX_ANSWER = 512  # notices in one answer; more say `gap` instead
MAX_PAYLOAD = 300  # a lane's name and a runner id; longer is nobody's hint
PING_S = 10.0
RETRY_S = 1.0


class Notices:
    """The process's LISTEN connection and the notices it heard, numbered."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.epoch = uuid.uuid4().hex[:8]
        self.seq = 0
        self.kept: deque[tuple[int, Notice]] = deque(maxlen=KEEP)
        self._news = asyncio.Event()  # set, and replaced, at each notice or new epoch
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Listen from now on (in the background; reconnected after a drop)."""
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name="notices")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def cursor(self) -> str:
        return f"{self.epoch}:{self.seq}"

    async def wait(self, after: str | None, timeout_s: float) -> Wake:
        """The notices after `after`, waiting up to `timeout_s` for one."""
        epoch, _, number = (after or "").partition(":")
        ok = epoch == self.epoch and number.isascii() and number.isdecimal() and len(number) < 19
        seen = int(number) if ok else None
        if seen is None or seen > self.seq:
            return Wake(next=self.cursor(), notices=[], gap=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self.seq == seen and self.epoch == epoch:
                    await self._news.wait()
        if self.epoch != epoch:
            return Wake(next=self.cursor(), notices=[], gap=True)
        oldest = self.kept[0][0] if self.kept else self.seq + 1
        notices = [n for s, n in self.kept if s > seen]
        if len(notices) > MAX_ANSWER:  # a flood: look at everything once instead
            return Wake(next=self.cursor(), notices=[], gap=True)
        return Wake(next=self.cursor(), notices=notices, gap=seen + 1 < oldest)

    def _heard(self, _conn: object, _pid: int, channel: str, payload: object) -> None:
        if len(str(payload)) > MAX_PAYLOAD:
            return  # not one of fleetq's hints (`LANE RUNNER`, `job:N`, `config`): any
            # login may NOTIFY, and every runner would be sent it
        self.seq += 1
        self.kept.append((self.seq, Notice(channel=channel, payload=str(payload))))
        self._tell()

    def _tell(self) -> None:
        news, self._news = self._news, asyncio.Event()
        news.set()

    async def _listen(self) -> None:
        while True:
            try:
                with mapped_errors():
                    conn = await connect_each_host(
                        as_uri(self.dsn),
                        timeout=10,
                        server_settings={"application_name": "fleetq-api-listen"},
                    )
            except FleetqError as exc:
                log.warning("LISTEN connection failed (%s); retrying", exc)
                await asyncio.sleep(RETRY_S)
                continue
            try:
                lost = asyncio.Event()
                conn.add_termination_listener(functools.partial(_set, lost))
                for channel in CHANNELS:
                    await conn.add_listener(channel, self._heard)
                # what was said before now went unheard: a new epoch tells every runner
                self.epoch = uuid.uuid4().hex[:8]
                self._tell()
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), PING_S)
                    if not lost.is_set():
                        await conn.fetchval("SELECT 1", timeout=5)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                log.warning("LISTEN connection lost (%s); reconnecting", exc)
            finally:
                with contextlib.suppress(Exception):
                    await conn.close(timeout=2)
            await asyncio.sleep(RETRY_S)


def _set(event: asyncio.Event, _conn: object) -> None:
    event.set()
