"""Handlers' timeouts, on a timer wheel: one loop timer per tick of DEADLINE_TICK_S,
shared by every handler whose deadline falls on it (see `Deadlines` for why)."""

from __future__ import annotations

import asyncio
import math
import weakref

# A handler's timeout fires within this much of its deadline (see Deadlines).
DEADLINE_TICK_S = 0.05


class _Armed:
    """One handler's timeout: the task to cancel when its tick comes."""

    __slots__ = ("fired", "live", "task", "tick")

    def __init__(self, task: asyncio.Task[object], tick: int) -> None:
        self.task, self.tick, self.fired, self.live = task, tick, False, True


class Deadlines:
    """Handlers' timeouts on one timer per tick, not one per job.

    `asyncio.timeout` schedules a timer for every handler it guards and cancels it when
    the handler returns: under a backlog, where a runner starts hundreds of handlers at
    once and most return at once, that was 9% of its busy CPU (py-spy). The jobs a claim
    takes start together and share a timeout, so their deadlines, rounded up to a tick of
    DEADLINE_TICK_S, fall on one tick: one timer for the batch, and a set insert and
    removal per job. A timeout fires up to a tick late.

    A tick whose handlers have all returned keeps its timer until the next tick is made
    (so the rest of a batch finds it), then is dropped with it: pending ticks are never
    more than the ticks handlers still wait on, however long the timeouts. Nothing here
    holds the loop (a timer only weakly), so a closed loop's deadlines go with it.
    """

    def __init__(self) -> None:
        self.due: dict[int, tuple[set[_Armed], weakref.ref[asyncio.TimerHandle]]] = {}
        self.emptied: set[int] = set()  # ticks whose handlers all returned

    def arm(
        self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[object], timeout_s: float
    ) -> _Armed:
        if timeout_s <= 0:  # due already: at the handler's first await, as asyncio.timeout
            armed = _Armed(task, -1)
            loop.call_soon(self._fire_one, armed)
            return armed
        tick = math.ceil((loop.time() + timeout_s) / DEADLINE_TICK_S)
        armed = _Armed(task, tick)
        entry = self.due.get(tick)
        if entry is None:
            self._sweep()
            timer = loop.call_at(tick * DEADLINE_TICK_S, self._fire, tick)
            entry = self.due[tick] = (set(), weakref.ref(timer))
        entry[0].add(armed)
        return armed

    def disarm(self, armed: _Armed) -> None:
        armed.live = False
        entry = self.due.get(armed.tick)
        if entry is not None:
            entry[0].discard(armed)
            if not entry[0]:
                self.emptied.add(armed.tick)

    def _sweep(self) -> None:
        for tick in self.emptied:
            entry = self.due.get(tick)
            if entry is not None and not entry[0]:
                del self.due[tick]
                if (timer := entry[1]()) is not None:
                    timer.cancel()
        self.emptied.clear()

    def _fire(self, tick: int) -> None:
        self.emptied.discard(tick)
        entry = self.due.pop(tick, None)
        for armed in entry[0] if entry is not None else ():
            self._fire_one(armed)

    @staticmethod
    def _fire_one(armed: _Armed) -> None:
        if armed.live:
            armed.fired = True
            armed.task.cancel()


_deadlines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Deadlines] = (
    weakref.WeakKeyDictionary()
)


def deadlines(loop: asyncio.AbstractEventLoop) -> Deadlines:
    """`loop`'s handler deadlines."""
    if (found := _deadlines.get(loop)) is None:
        found = _deadlines[loop] = Deadlines()
    return found
