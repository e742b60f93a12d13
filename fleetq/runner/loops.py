"""How the runner's loops meet errors: log, back off, try again; only a bug ends them.

Why: a runner is a service. The database restarts, a network drops packets, an operator
holds a row lock past `lock_timeout`, a statement times out: the driver seam maps each to
a `FleetqError` (`core.driver.map_error`), and every loop logs it and tries again after
a capped, jittered exponential backoff. Anything else is a bug in fleetq: it propagates
to `RunnerService`, which hands its leases back before the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Sequence

from fleetq.core.driver import map_error
from fleetq.core.errors import ConnectionFailed, DatabaseBusy, FleetqError, InvalidInput

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0


def environmental(exc: BaseException) -> FleetqError | None:
    """The fleetq error an exception stands for when it comes from the world outside
    (database, network), else None: then it is a bug. `InvalidInput` is fleetq's own
    check of what fleetq itself passed, so a runner meeting it has a bug."""
    if isinstance(exc, InvalidInput):
        return None
    if isinstance(exc, FleetqError):
        return exc
    return map_error(exc) if isinstance(exc, Exception) else None


def transient(error: FleetqError) -> bool:
    """Whether the same request may succeed when tried again unchanged."""
    return isinstance(error, ConnectionFailed | DatabaseBusy)


class Backoff:
    """Capped exponential delays with jitter, so a fleet's runners do not retry in step
    after a database restart."""

    def __init__(self, first: float = BACKOFF_FIRST_S, cap: float = BACKOFF_MAX_S) -> None:
        self.first, self.cap = first, cap
        self.failures = 0

    def reset(self) -> None:
        self.failures = 0

    def next(self) -> float:
        """The delay before the next try (and count this failure)."""
        self.failures += 1
        delay: float = min(self.cap, self.first * 2.0 ** (self.failures - 1))
        return delay * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not a secret

    async def sleep(self, interrupt: asyncio.Event | None = None) -> float:
        """Wait the next delay, or less if `interrupt` is set meanwhile; returns it."""
        delay = self.next()
        await wait_or(interrupt, delay)
        return delay


async def wait_any(events: Sequence[asyncio.Event], seconds: float) -> None:
    """Wait up to `seconds` for any of `events`."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def wait_or(event: asyncio.Event | None, seconds: float) -> bool:
    """Wait up to `seconds` for `event`; True when it is set."""
    if event is None:
        await asyncio.sleep(seconds)
        return False
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
    return event.is_set()


async def every(
    interval: float | Callable[[], float],
    what: str,
    work: Callable[[], Awaitable[None]],
    done: asyncio.Event,
    wake: asyncio.Event | None = None,
) -> None:
    """Run `work` every `interval` seconds until `done`. A failure is logged and retried
    sooner (backing off, never later than the interval): a heartbeat that failed once
    must not wait a whole interval to try again. `wake` says the interval may have moved
    sooner (it is asked again then)."""
    backoff = Backoff()
    wait = interval() if callable(interval) else interval
    while not done.is_set():
        if await _wait(done, wake, wait, interval):
            return
        period = interval() if callable(interval) else interval
        try:
            await work()
        except Exception as exc:
            if (error := environmental(exc)) is None:
                raise
            wait = min(period, backoff.next())
            log.warning("%s failed (%s); retrying in %.1fs", what, error, wait)
            continue
        backoff.reset()
        wait = interval() if callable(interval) else interval  # the work may move it


async def _wait(
    done: asyncio.Event,
    wake: asyncio.Event | None,
    seconds: float,
    interval: float | Callable[[], float],
) -> bool:
    """Wait `seconds`, or less when `wake` brings the interval sooner; True when done."""
    if wake is None:
        return await wait_or(done, seconds)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        wake.clear()
        woken = asyncio.ensure_future(wake.wait())
        finished = asyncio.ensure_future(done.wait())
        try:
            await asyncio.wait(
                (woken, finished),
                timeout=max(0.0, deadline - loop.time()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            woken.cancel()
            finished.cancel()
        if done.is_set():
            return True
        if not wake.is_set():
            return False  # the time has come
        now_due = interval() if callable(interval) else interval
        deadline = min(deadline, loop.time() + now_due)


async def persist(what: str, write: Callable[[], Awaitable[None]], give_up: asyncio.Event) -> bool:
    """Retry a write that must reach the database until it does (True), or until
    `give_up` is set (False: the caller's process is shutting down)."""
    backoff = Backoff()
    while True:
        try:
            await write()
            return True
        except Exception as exc:
            if (error := environmental(exc)) is None:
                raise
            if give_up.is_set():
                log.warning("could not record %s before shutting down: %s", what, error)
                return False
            log.warning("recording %s failed (%s); retrying", what, error)
            await backoff.sleep(give_up)
