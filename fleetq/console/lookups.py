"""Reads an operator asks for, beside the loads: the runners' heartbeats each second,
every job matching a filter, a page of an incident search, a runner's last hour.

Each runs as an exclusive worker of the app (a newer ask replaces an older one) and
posts its answer to the widget that asked: workers never touch widgets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING

from textual.widget import Widget

from fleetq.console.messages import (
    AccessRead,
    Acted,
    Health,
    Heartbeats,
    Hint,
    MarkedAll,
    RunnerHour,
    Searched,
)
from fleetq.console.screenful import db_clock
from fleetq.core.errors import FleetqError
from fleetq.core.jobpages import JobFilter
from fleetq.core.views import EventQuery

if TYPE_CHECKING:
    from fleetq.console.app import ConsoleApp

SEARCH_PAGE = 200  # events an incident search reads at a time
BEAT_S = 1.0  # heartbeat ages are read this often while on screen
BEATING = ("runners", "overview")  # the views that show heartbeat ages


class Lookups:
    """The on-demand reads of one console."""

    def __init__(self, app: ConsoleApp) -> None:
        self.app = app

    def _work(self, group: str, what: str, run: Callable[[], Awaitable[None]]) -> None:
        async def guarded() -> None:
            try:
                await run()
            except FleetqError as exc:
                self.app.post_message(Acted(f"{what} failed: {exc}", error=True))

        self.app.run_worker(guarded(), group=group, exclusive=True, exit_on_error=False)

    def boot(self) -> None:
        """Connect (retrying with backoff while the database is away), read what the
        login may do, then follow the database (or, not live, read once)."""
        app = self.app

        async def run() -> None:
            delay = 0.25
            while True:
                try:
                    await app.source.open()
                    app.post_message(AccessRead(await app.source.access()))
                    break
                except FleetqError as exc:
                    app.post_message(Health(datetime.now().astimezone(), why=str(exc)))
                    await app.source.close()
                    await asyncio.sleep(delay)  # backoff between reconnects
                    delay = min(delay * 2, 5.0)
            if app.source.clock is None:
                self.heartbeats()
            if app.live:
                app.run_worker(app.follower.follow(), group="listen", exit_on_error=False)
            else:
                app.post_message(Hint(resync=True))

        app.run_worker(run(), group="boot", exit_on_error=False)

    def heartbeats(self) -> None:
        """Once a second, while a view that shows heartbeat ages is on screen, read the
        runners' last heartbeats and post them to it (quiet on failure: the load path
        reports outages). One long-lived worker: a worker a second cost more CPU than
        the read."""
        app = self.app

        async def run() -> None:
            while True:
                await asyncio.sleep(BEAT_S)  # a clock, not synchronisation
                if app.current not in BEATING or not app.ready or app.frozen:
                    continue
                with contextlib.suppress(FleetqError):
                    beats = await app.source.heartbeats()
                    if (now := db_clock(app)) is not None:
                        app.query_one(f"#{app.current}").post_message(Heartbeats(beats, now))

        app.run_worker(run(), group="beat", exclusive=True, exit_on_error=False)

    def job_ids(self, where: JobFilter, to: Widget) -> None:
        """Every job matching `where` (mark all that match), however many."""

        async def run() -> None:
            to.post_message(MarkedAll(where, await self.app.source.job_ids(where)))

        self._work("marks", "mark all", run)

    def events(self, query: EventQuery, below: int | None, to: Widget) -> None:
        """A page of the search, below the id `below` (None: the newest)."""

        async def run() -> None:
            found = await self.app.source.search_events(query, below, SEARCH_PAGE + 1)
            more = len(found) > SEARCH_PAGE
            to.post_message(Searched(found[:SEARCH_PAGE], first=below is None, more=more))

        self._work("search", "search", run)

    def runner_hour(self, runner: str, to: Widget) -> None:
        """The runner's events of the last hour, counted by kind."""

        async def run() -> None:
            at = await self.app.source.now()
            to.post_message(RunnerHour(runner, await self.app.source.runner_hour(runner, at), at))

        self._work("hour", f"{runner}'s hour", run)
