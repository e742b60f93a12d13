"""Wake-ups for a runner served through the API: the gateway's notices, by long poll.

In place of the LISTEN connection (`control.Control`): the notices are the same hints,
handled the same way. A poll that fails, or a `gap` answer (the gateway's own LISTEN
connection was away, or a poll reached another gateway process), makes every lane look
once and the configuration be read again, as after a LISTEN connection comes back; a
gateway out of reach meanwhile costs what a lost LISTEN connection costs: the lanes poll.

The runner id: a direct runner holds it with its LISTEN session; here it is held for
HOLD_S (`fleetq.hold_runner_id`) and renewed every third of that. The holder is named by
this node and runner directory, which the pidfile keeps to one process: a restart here
takes its hold back at once, a clean stop shortens the hold to RELEASE_S, and a second
process elsewhere with the same token is refused (`RunnerIdInUse`, naming the holder)
until the hold has run out. A renewal that
finds another holder displaces this process, as a direct runner's does.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket

from fleetq.core import queries
from fleetq.runner import loops
from fleetq.runner.control import ApiListener, Control, Listener
from fleetq.runner.identity import RunnerIdInUse
from fleetq.runner.remote import ApiDriver

log = logging.getLogger("fleetq.runner.service")

HOLD_S = 30  # a runner id held through the API frees this long after its last renewal
RELEASE_S = 5  # and this long after a clean stop (the shortest hold there is)


class ApiControl(Control):
    """`Control` whose notices come from the gateway (`GET /v1/runner/wake`)."""

    api: ApiDriver
    displaced = False  # another process holds the id now: its hold is not this one's

    async def connect_listener(self) -> Listener:
        """Hold the runner id (there is no connection to open)."""
        await self.hold()
        return ApiListener()

    async def session_lives(self, conn: Listener) -> bool:
        return True

    def holder(self) -> str:
        where = hashlib.sha256(str(self.config.directory().resolve()).encode()).hexdigest()
        return f"fleetq-runner --api on {socket.gethostname()[:100]} in {where[:12]}"

    async def hold(self, seconds: int = HOLD_S) -> None:
        """Hold the runner id for `seconds` more, or raise `RunnerIdInUse`."""
        (row,) = await self.api.fetch(
            queries.sql("runners_hold_identity"), self.runner, self.holder(), seconds
        )
        if not row["taken"]:
            left = f", for {row['left_s']:.0f}s more" if row["left_s"] is not None else ""
            raise RunnerIdInUse(
                f"runner {self.runner} is already served by another process ({row['holder']}, "
                f"login {row['login']}{left}); stop that process first, or give this one "
                "another --name"
            )

    async def listen(self, first: Listener) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._hold_on())
            await self._follow()
        if self.done.is_set() and not self.displaced:
            await self._let_go()

    async def _let_go(self) -> None:
        """At a clean stop (every run ended, every lease given back: `done`), shorten the
        hold to RELEASE_S, so a process elsewhere may take the id in seconds, not HOLD_S."""
        try:
            await self.hold(RELEASE_S)
        except RunnerIdInUse:
            return  # another process holds it already: nothing of this one's to shorten
        except Exception as exc:
            if (error := loops.environmental(exc)) is None:
                raise
            log.info("could not shorten the hold on runner id %s (%s)", self.runner, error)

    async def _hold_on(self) -> None:
        """Renew the hold every third of HOLD_S; another holder displaces this process."""
        while not await loops.wait_or(self.done, HOLD_S / 3):
            try:
                await self.hold()
            except RunnerIdInUse as exc:
                self.displaced = True
                self.displaced_by(exc)
                return
            except Exception as exc:
                if (error := loops.environmental(exc)) is None:
                    raise
                log.warning("could not renew the hold on runner id %s (%s)", self.runner, error)

    async def _follow(self) -> None:
        cursor: str | None = None
        backoff = loops.Backoff()
        polls = 0
        while not self.done.is_set():
            call = asyncio.ensure_future(self.api.wake(cursor))
            stop = asyncio.ensure_future(self.done.wait())
            await asyncio.wait({call, stop}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if not call.done():
                call.cancel()
                return
            try:
                wake = call.result()
            except Exception as exc:
                if (error := loops.environmental(exc)) is None:
                    raise
                delay = await backoff.sleep(self.done)
                log.warning(
                    "wake-ups from the gateway failed (%s); retried after %.1fs", error, delay
                )
                cursor = None  # the next answer is a gap: every lane looks once
                continue
            backoff.reset()
            if wake.get("gap"):
                if polls:
                    log.info("wake-ups from the gateway may have been missed; polling once")
                    self.background.coalesced("config", self.hooks.reread_config)
                self._wake_lanes()
            polls += 1
            cursor = str(wake.get("next") or "") or None
            for notice in wake.get("notices") or []:
                handle = (
                    self._on_work if notice.get("channel") == "fleetq_work" else self._on_control
                )
                handle(None, 0, str(notice.get("channel")), notice.get("payload"))
