"""One read of what the visible views show: the body of the app's load worker.

A read never touches widgets (STYLE example 10): it returns the messages the worker
posts, and `@on` handlers in the app put them on screen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from textual.message import Message

from fleetq.console.commands import connection_trouble
from fleetq.console.messages import Health, Hint, Loaded, Missing
from fleetq.console.screenful import show_loaded, view_ready
from fleetq.console.source import Source
from fleetq.console.text import escape
from fleetq.console.views.detail import DetailView
from fleetq.console.views.jobs import JobsView
from fleetq.core.errors import FleetqError, NotFound
from fleetq.core.jobpages import JobFilter, JobOrder
from fleetq.core.models import JobId

if TYPE_CHECKING:
    from fleetq.console.app import ConsoleApp

EVENT_BATCH = 1000
EVENT_LOOKBACK = 200  # ids re-read behind the newest seen (late commits)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Wanted:
    """What is on screen, so what a read must fetch."""

    current: str
    where: JobFilter
    detail_job: JobId | None
    last_event: int | None
    order: JobOrder = JobOrder.NEWEST  # the jobs view's


async def read(source: Source, wanted: Wanted, *, resync: bool, epoch: int) -> list[Message]:
    """Read the visible views; on any failure a `Health` and a failed `Loaded`, so a load
    can never stay "in flight" and block the ones after it."""
    try:
        return await _read(source, wanted, resync=resync, epoch=epoch)
    except Exception as exc:  # any failure must end the load
        why = str(exc) if isinstance(exc, FleetqError) else f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, FleetqError):
            log.exception("console load failed")
        return [Health(datetime.now().astimezone(), why=why), Loaded.failed(epoch)]


async def _read(source: Source, wanted: Wanted, *, resync: bool, epoch: int) -> list[Message]:
    out: list[Message] = []
    current = wanted.current
    at = await source.now()
    overview = await source.overview(at)
    page = await source.page(wanted.where, at, order=wanted.order) if current == "jobs" else None
    overlaps = await source.overlaps() if current == "overlaps" else None
    listed = await source.schedules(at) if current == "schedules" else None
    alerts = await source.alert_jobs(overview.alerts) if current == "overview" else None
    detail = None
    if current == "detail" and wanted.detail_job is not None:
        try:
            detail = await source.detail(wanted.detail_job, at)
        except NotFound:
            out.append(Missing(wanted.detail_job))
    # Event ids are taken at insert, not at commit: re-read a window behind the newest id
    # seen, so an event whose transaction committed late still shows.
    after = None if resync or wanted.last_event is None else wanted.last_event
    events = await source.events(
        None if after is None else max(0, after - EVENT_LOOKBACK), EVENT_BATCH + EVENT_LOOKBACK
    )
    full = after is None or len(events) >= EVENT_BATCH + EVENT_LOOKBACK
    if full and after is not None:
        events = await source.events(None, EVENT_BATCH)
    out.append(
        Loaded(
            overview,
            page,
            detail,
            events,
            resync=full,
            epoch=epoch,
            overlaps=overlaps,
            schedules=listed,
            alert_jobs=alerts,
        )
    )
    return out


class Reads:
    """The app's loads: one in flight at most (a hint mid-load schedules one more after
    it, so a busy fleet costs at most one read in flight), each ending in exactly one
    `Loaded`; outages counted by epoch, so a read begun before one cannot end it."""

    def __init__(self, app: ConsoleApp) -> None:
        self.app = app
        self.count = 0  # reads put on screen, not failed ones
        self.epoch = 0  # bumped by each reported outage
        self.missed = False  # a change came while the screen was frozen
        self._loading = False
        self._again: Hint | None = None

    @property
    def busy(self) -> bool:
        """A read is in flight or due."""
        return self._loading or self._again is not None

    def hint(self, hint: Hint) -> None:
        """Something changed (or a resync is due): read, now or after the read in flight."""
        if self.app.frozen and not hint.resync:
            self.missed = True  # shown when the operator thaws the screen
            return
        if self._loading:
            resync = hint.resync or (self._again.resync if self._again else False)
            self._again = Hint(resync=resync)
            return
        self._loading = True
        app = self.app
        order = app.query_one(JobsView).order
        wanted = Wanted(app.current, app.where, app.detail_job, app.last_event, order)

        async def run() -> None:
            for message in await read(app.source, wanted, resync=hint.resync, epoch=self.epoch):
                app.post_message(message)

        app.run_worker(run(), group="load", exit_on_error=False)

    def loaded(self, loaded: Loaded) -> None:
        """A read ended: show it, maybe end an outage, run what was due."""
        app = self.app
        self._loading = False
        if not loaded.ok:
            app.release_keys()  # nothing better is coming soon: keys go where they can
            self._retry()
            return
        show_loaded(app, loaded)
        # Live again only on a read that began after the last outage was reported, and
        # while the database is being followed (else a read already in flight when the
        # LISTEN link dropped would switch actions back on).
        following = not app.live or app.follower.connected.is_set()
        if loaded.epoch == self.epoch and following and (app.stale_since or not app.ready):
            app.stale_since = None
            app.ready = True
            app.status()
        if view_ready(app) and app.typeahead.rows:
            # even with a read due (a busy fleet always has one); a hold for a dialog or
            # a view switch still to come is not this read's to end (`3j` then put the j
            # on the view it left)
            app.release_keys()
        if self._again is not None:
            again, self._again = self._again, None
            self.hint(again)

    def _retry(self) -> None:
        """After a failed load: run what was due, else try again in a second (a load can
        fail while the LISTEN link is fine, e.g. a query timeout)."""
        if self._again is not None:
            again, self._again = self._again, None
            self.hint(again)
        else:
            self.app.set_timer(1.0, lambda: self.app.post_message(Hint(resync=True)))

    def health(self, health: Health) -> None:
        """The database went away (a read or the LISTEN link failed)."""
        if health.stale_since is None:
            return
        app = self.app
        self.epoch += 1  # reads begun before this cannot clear it
        app.stale_why = connection_trouble(health.why)
        if app.stale_since is None:
            app.stale_since = health.stale_since
            app.outages += 1
            app.notify(
                escape(health.why) or "connection lost",
                title="stale",
                severity="warning",
                markup=False,
            )
        app.status()

    def missing(self, missing: Missing) -> None:
        """The detail's job does not exist: say so where it would be."""
        app = self.app
        if app.detail_job == missing.job_id:
            app.detail_job = None
            app.query_one(DetailView).clear(f"no job {missing.job_id}")
            app.notify(f"no job {missing.job_id}", severity="error", markup=False)
