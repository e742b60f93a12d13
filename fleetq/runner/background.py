"""Work the runner starts beside its loops: control actions (a notice's re-read, a
drained runner's beat) run once each, under `loops`' error rule (a database error is
logged; a bug ends the runner through `on_bug`), and coalesced where a burst of notices
would otherwise cost one read per notice."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fleetq.runner import loops

log = logging.getLogger("fleetq.runner.service")


class Background:
    """The runner's one-off tasks, kept referenced until they end."""

    def __init__(self, on_bug: Callable[[str, Exception], None]) -> None:
        self._on_bug = on_bug
        self._tasks: set[asyncio.Task[None]] = set()
        # per coalesced action running now, whether it was asked for again meanwhile
        self._in_flight: dict[str, bool] = {}

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` beside the loops; a database error is logged, a bug reported."""
        task = asyncio.ensure_future(self._quietly(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def coalesced(self, key: str, action: Callable[[], Awaitable[None]]) -> None:
        """Run `action` now, or, if it is running, once more after it (what it read may
        predate the news): never two at once, however many notifications ask."""
        if key in self._in_flight:
            self._in_flight[key] = True
            return
        self._in_flight[key] = False
        self.spawn(self._run_coalesced(key, action))

    async def _run_coalesced(self, key: str, action: Callable[[], Awaitable[None]]) -> None:
        try:
            again = True
            while again:
                self._in_flight[key] = False
                await action()
                again = self._in_flight[key]
        finally:
            del self._in_flight[key]

    async def _quietly(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except Exception as exc:
            if (error := loops.environmental(exc)) is None:
                self._on_bug("a control action", exc)
                return
            log.warning("control action failed: %s", error)
