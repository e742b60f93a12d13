"""What the console's workers tell the app. Workers never touch widgets: they read the
database and post one of these; `@on` handlers in the app put the data on screen."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from textual.message import Message

from fleetq.core.jobpages import JobFilter, JobPage
from fleetq.core.models import Event, JobId
from fleetq.core.schedules import Listed
from fleetq.core.stats import Overlap
from fleetq.core.views import Access, AlertJob, Heartbeat, JobDetail, Overview

M = TypeVar("M")


def while_open(handler: Callable[[Any, M], None]) -> Callable[[Any, M], None]:
    """Drop a message that arrives once the app has begun to close. Closing removes the
    widgets, each view's children before the view, while the app still reads its
    messages (Textual's test harness closes it so): a read that landed then found a jobs
    view without its status line, and the console ended with NoMatches."""

    @functools.wraps(handler)
    def handle(app: Any, message: M) -> None:
        if app.is_running:
            handler(app, message)

    return handle


class Hint(Message):
    """The database said something changed (a NOTIFY, coalesced) or a resync is due."""

    def __init__(self, *, resync: bool = False) -> None:
        super().__init__()
        self.resync = resync

    def can_replace(self, message: Message) -> bool:
        # A pending hint covers any earlier one; a resync covers a plain hint too.
        return isinstance(message, Hint) and (self.resync or not message.resync)


class Loaded(Message):
    """A fresh read of what the visible views show (or, `ok` false, a read that failed)."""

    def __init__(
        self,
        overview: Overview | None,
        page: JobPage | None,
        detail: JobDetail | None,
        events: list[Event],
        *,
        resync: bool,
        epoch: int,
        overlaps: list[Overlap] | None = None,
        schedules: list[Listed] | None = None,
        alert_jobs: list[AlertJob] | None = None,
    ) -> None:
        super().__init__()
        self.alert_jobs = alert_jobs
        self.epoch = epoch  # the outage count when the read began
        self.overlaps = overlaps
        self.schedules = schedules
        self.overview = overview
        self.page = page
        self.detail = detail
        self.events = events
        self.resync = resync

    @property
    def ok(self) -> bool:
        """The read succeeded."""
        return self.overview is not None

    @classmethod
    def failed(cls, epoch: int) -> Loaded:
        """A read that failed: the load is over, nothing to show."""
        return cls(None, None, None, [], resync=False, epoch=epoch)


class Missing(Message):
    """The job the detail view shows does not exist."""

    def __init__(self, job_id: JobId) -> None:
        super().__init__()
        self.job_id = job_id


class DrainPreview(Message):
    """What a drain of `runner` would do to each affected job, for the drain form."""

    def __init__(self, runner: str, preview: list[tuple[int, str, str]]) -> None:
        super().__init__()
        self.runner = runner
        self.preview = preview


class Health(Message):
    """The console lost the database (`stale_since` set) or is live again (None)."""

    def __init__(self, stale_since: datetime | None, why: str = "") -> None:
        super().__init__()
        self.stale_since = stale_since
        self.why = why

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, Health)


class Acted(Message):
    """An operator action finished: what it did, in one line for the log and toast."""

    def __init__(self, summary: str, *, error: bool = False) -> None:
        super().__init__()
        self.summary = summary
        self.error = error


class OpenJob(Message):
    """The operator asked for a job's detail (Enter on a job or an event)."""

    def __init__(self, job_id: JobId) -> None:
        super().__init__()
        self.job_id = job_id


class DrillDown(Message):
    """Enter on a runner or a lane: its jobs (or, `e` on a runner, its events)."""

    def __init__(
        self,
        *,
        runner: str | None = None,
        lane: str | None = None,
        events: bool = False,
        since: datetime | None = None,
    ) -> None:
        super().__init__()
        self.runner = runner
        self.lane = lane
        self.events = events
        self.since = since  # events only: from this time on (a runner's last hour)


class AccessRead(Message):
    """What the console's login may do, read once it has connected."""

    def __init__(self, access: Access) -> None:
        super().__init__()
        self.access = access


class Heartbeats(Message):
    """The runners' last heartbeats, read once a second while their ages are on screen."""

    def __init__(self, beats: list[Heartbeat], now: datetime) -> None:
        super().__init__()
        self.beats = beats
        self.now = now


class ReleaseKeys(Message):
    """What held keys waited for is ready: route them (typeahead), if they are still
    the keys of that hold (`hold`): a release read after a newer hold began is stale,
    and let `3j` put its j on the view it left."""

    def __init__(self, hold: int) -> None:
        super().__init__()
        self.hold = hold


class AfterKeys(Message):
    """Posted to the focused widget, it reaches the app behind the keys queued there
    before it, which bubble the same way up to their bindings: `act` runs after them."""

    def __init__(self, act: Callable[[], None]) -> None:
        super().__init__()
        self.act = act


class MarkedAll(Message):
    """Every job matching `where` (mark all that match), read on the server."""

    def __init__(self, where: JobFilter, ids: list[JobId]) -> None:
        super().__init__()
        self.where = where
        self.ids = ids


class Progress(Message):
    """A bulk action's progress: `done` of `total`."""

    def __init__(self, done: int, total: int) -> None:
        super().__init__()
        self.done = done
        self.total = total


class Searched(Message):
    """A page of an incident search (events), newest first; `more` if older ones exist."""

    def __init__(self, events: list[Event], *, first: bool, more: bool) -> None:
        super().__init__()
        self.events = events
        self.first = first
        self.more = more


class RunnerHour(Message):
    """A runner's last hour: its events counted by kind."""

    def __init__(self, runner: str, kinds: list[tuple[str, int, datetime]], at: datetime) -> None:
        super().__init__()
        self.runner = runner
        self.kinds = kinds
        self.at = at  # the database's clock when it was read
