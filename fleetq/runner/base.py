"""What the runner's parts share: its state, and how they start background work.

`RunnerService` (`service`) composes the parts: the claimers (`claimer`), a component
of their own, and mixins over this base with one responsibility each: `keeping`
(leases: renewal, the self-fence, stops, the collection and reaper passes, the runner's
own state) and `control` (the LISTEN connection and the lock on the runner id). A part
reaches another only through the methods declared here, and every loop follows `loops`'
error rule.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fleetq.core.driver import AsyncpgDriver
from fleetq.core.models import FencingToken, JobId, RunnerId, RunnerState
from fleetq.core.schedules import MinuteChecks
from fleetq.runner import loops
from fleetq.runner.config import RunnerConfig
from fleetq.runner.execution import Execution, Toolkit
from fleetq.runner.reporter import Reporter

log = logging.getLogger("fleetq.runner.service")


class RunnerBase:
    """The state of one fleetq-runner process (set up by `RunnerService.__init__`)."""

    config: RunnerConfig
    runner: RunnerId
    driver: AsyncpgDriver
    reporter: Reporter
    kit: Toolkit
    executions: dict[JobId, Execution]
    tasks: dict[JobId, asyncio.Task[None]]
    _superseded: dict[asyncio.Task[None], tuple[JobId, FencingToken]]
    wakes: dict[str, asyncio.Event]
    state: RunnerState
    shutdown_requested: asyncio.Event
    beat_wake: asyncio.Event  # the heartbeat loop looks again when its next renewal is due
    immediate_requested: asyncio.Event
    done: asyncio.Event
    lease_seconds: int
    offline_after_seconds: int
    exit_code: int
    displaced: bool
    # leases of this runner id the start-up collection left to a holder that may live
    inherited: set[tuple[JobId, FencingToken]]
    schedule_checks: MinuteChecks
    reap_due: float  # loop time a retry falls due, which a reaper pass must not miss
    reap_wake: asyncio.Event  # set when reap_due moved sooner
    dsn: str
    dsn_names: set[str]
    session_settings: dict[str, str]
    _token: str

    # -- implemented by the parts (declared here so each part can call the others) ----

    def request_shutdown(self) -> None:
        raise NotImplementedError

    def _bug(self, what: str, exc: Exception) -> None:
        raise NotImplementedError

    async def _heartbeat_once(self) -> None:
        raise NotImplementedError

    async def _follow_state(self) -> None:
        raise NotImplementedError

    async def _stop_lost(self, job_ids: list[JobId]) -> None:
        raise NotImplementedError

    def _beat_s(self) -> float:
        raise NotImplementedError

    async def _reread_config(self) -> None:
        raise NotImplementedError

    def _coalesced(self, key: str, action: Callable[[], Awaitable[None]]) -> None:
        raise NotImplementedError

    async def _close_unrun_executions(self) -> None:
        raise NotImplementedError

    def _running_in(self, lane: str) -> int:
        raise NotImplementedError

    # -- shared helpers ------------------------------------------------------------------

    def _wake_all(self) -> None:
        for wake in self.wakes.values():
            wake.set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(self._quietly(coro))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _quietly(self, coro: Any) -> None:
        try:
            await coro
        except Exception as exc:
            if (error := loops.environmental(exc)) is None:
                self._bug("a control action", exc)
                return
            log.warning("control action failed: %s", error)

    @property
    def _background(self) -> set[asyncio.Task[None]]:
        if not hasattr(self, "_bg"):
            self._bg: set[asyncio.Task[None]] = set()
        return self._bg
