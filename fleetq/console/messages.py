"""What the console's workers tell the app. Workers never touch widgets: they read the
database and post one of these; `@on` handlers in the app put the data on screen."""

from __future__ import annotations

from datetime import datetime

from textual.message import Message

from fleetq.core.models import Event, JobId
from fleetq.core.schedules import Listed
from fleetq.core.stats import Overlap
from fleetq.core.views import JobDetail, JobPage, Overview


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
    ) -> None:
        super().__init__()
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
        self, *, runner: str | None = None, lane: str | None = None, events: bool = False
    ) -> None:
        super().__init__()
        self.runner = runner
        self.lane = lane
        self.events = events
