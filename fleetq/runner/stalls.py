"""Whether the runner was there to see a run end (issue 48).

A run's end is *measured* when the runner dated the exit as it happened. It learns of the
exit through its event loop, so a loop that did not run for a while (the runner frozen
by SIGSTOP, a paused VM, a blocked loop) learns late: the process may have exited at any
moment of the stall, and the time the runner noticed is only an upper bound. A ticker on
the loop tells the two apart: an end noticed while or just after the ticks stopped is
not dated (the database then bounds it by when the end is written, and says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Iterator

TICK_S = 0.1
# A gap this long between ticks is a stall, not scheduling noise on a loaded machine;
# it is also how far off a measured end may be at worst.
STALL_S = 0.5


class LoopWatch:
    """Ticks on the running loop while some run is watched; knows when it last stalled."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.stall_ended = -math.inf
        self.watched = 0
        self.task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            if now - self.last > STALL_S:
                self.stall_ended = now
            self.last = now

    def dated(self, at: float) -> bool:
        """Whether an end noticed at `at` (a `time.monotonic()` reading) is dated by it:
        the loop ran throughout the STALL_S before, so the end happened within that. If
        not, the end may lie anywhere in the stall, and `at` is only an upper bound."""
        return at - self.last <= STALL_S and at - self.stall_ended > STALL_S

    def dated_after(self, sent: float, at: float) -> bool:
        """Whether an end the runner caused by a stop it sent at `sent` and noticed at
        `at` is dated by `at`: the loop has not stalled since it sent the stop (a stall
        before that cannot hide an end that came after it)."""
        return at - self.last <= STALL_S and self.stall_ended < sent


_WATCHES: dict[asyncio.AbstractEventLoop, LoopWatch] = {}


@contextlib.contextmanager
def watching() -> Iterator[LoopWatch]:
    """The running loop's watch, ticking while at least one run is inside this block."""
    loop = asyncio.get_running_loop()
    watch = _WATCHES.get(loop)
    if watch is None:
        watch = _WATCHES[loop] = LoopWatch()
    if watch.task is None:
        watch.last = time.monotonic()
        watch.task = loop.create_task(watch._tick(), name="stall-watch")
    watch.watched += 1
    try:
        yield watch
    finally:
        watch.watched -= 1
        if watch.watched == 0:
            watch.task.cancel()
            watch.task = None
            del _WATCHES[loop]
