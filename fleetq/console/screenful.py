"""Putting a read on screen: which view gets what, and when a view shows what it was
asked for (the keys typed ahead of it may then go to it).

Only the visible view is drawn: hidden views are drawn when they are switched to, so a
big fleet costs one table, not four.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from textual.css.query import NoMatches

from fleetq.console.messages import Loaded
from fleetq.console.views.detail import DetailView
from fleetq.console.views.events import EventsView
from fleetq.console.views.jobs import JobsView
from fleetq.console.views.lanes import LanesView
from fleetq.console.views.overlaps import OverlapsView
from fleetq.console.views.overview import OverviewView
from fleetq.console.views.runners import RunnersView
from fleetq.console.views.schedules import SchedulesView

if TYPE_CHECKING:
    from fleetq.console.app import ConsoleApp

RECENT = 40  # events on the overview


def show_loaded(app: ConsoleApp, loaded: Loaded) -> None:
    """Put a successful read into the app's state and its visible view."""
    overview = loaded.overview
    assert overview is not None
    app.reads.count += 1
    app.db_now = (overview.now, time.monotonic())
    app.overview = overview
    events_view = app.query_one(EventsView)
    if loaded.resync:
        events_view.reset(loaded.events, draw=app.current == "events")
    else:
        events_view.extend(loaded.events, draw=app.current == "events")
    if loaded.events:
        app.last_event = max(app.last_event or 0, loaded.events[-1].id)
    show_overview(app, loaded)
    now = overview.now
    page = loaded.page
    if page is not None and app.current == "jobs" and page.where == app.where:
        app.query_one(JobsView).show(page, now)
    if loaded.overlaps is not None and app.current == "overlaps":
        app.query_one(OverlapsView).show(loaded.overlaps, now)
    if loaded.schedules is not None and app.current == "schedules":
        app.query_one(SchedulesView).show(loaded.schedules, now)
    detail = loaded.detail
    if detail is not None and app.current == "detail" and detail.job.id == app.detail_job:
        app.query_one(DetailView).show(detail, now)


def show_overview(app: ConsoleApp, loaded: Loaded | None = None) -> None:
    """Put the latest overview into the visible view that shows it."""
    if app.overview is None:
        return
    now = app.overview.now
    if app.current == "overview":
        recent = list(app.query_one(EventsView).tail)[-RECENT:][::-1]
        jobs = loaded.alert_jobs if loaded is not None else None
        app.query_one(OverviewView).show(app.overview, now, recent, jobs)
    elif app.current == "lanes":
        app.query_one(LanesView).show(app.overview, now)
    elif app.current == "runners":
        app.query_one(RunnersView).show(app.overview.runners, now)


def view_ready(app: ConsoleApp) -> bool:
    """The current view shows what it was asked for."""
    if app.current == "jobs":
        page = app.query_one(JobsView).page
        return page is not None and page.where == app.where
    if app.current == "detail":
        shown = app.query_one(DetailView).detail
        return app.detail_job is None or (shown is not None and shown.job.id == app.detail_job)
    return app.loads > 0


def tick(app: ConsoleApp) -> None:
    """Once a second: ages and lease countdowns from database time (the last read's
    clock plus local monotonic time since)."""
    if (now := db_clock(app)) is None:
        return
    try:
        if app.current == "jobs":
            app.query_one(JobsView).tick(now)
        elif app.current == "runners" and app.source.clock is not None:
            # live, the heartbeats read each second moves the ages on (`lookups`): a tick
            # of its own, out of step with it, drew every heartbeat cell twice a second
            app.query_one(RunnersView).tick(now)
        elif app.current == "detail":
            app.query_one(DetailView).tick(now)
    except NoMatches:
        pass  # a tick while the view's widgets are still mounting, or already gone


def focus_view(app: ConsoleApp, name: str) -> None:
    """Give the view's table the keyboard now (Widget.focus waits a turn, and keys read
    in between went to the old one)."""
    tables = list(app.query_one(f"#{name}").query("DataTable"))
    if tables:
        app.screen_stack[0].set_focus(tables[-1 if name == "detail" else 0])


def db_clock(app: ConsoleApp) -> datetime | None:
    """The database's clock now: the last read's, plus local monotonic time since."""
    if app.db_now is None:
        return None
    return app.db_now[0] + timedelta(seconds=time.monotonic() - app.db_now[1])
