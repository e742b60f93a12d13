"""The jobs view's cells and orders: pure functions of a job (and the clock)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from rich.text import Text

from fleetq.console.text import age, duration, one_line, plain
from fleetq.console.views.table import Cell
from fleetq.core.eligibility import Explanation
from fleetq.core.jobpages import STATE_ORDER, JobOrder, JobPage
from fleetq.core.models import Job


def same_page(old: JobPage, new: JobPage) -> bool:
    """The same rows and reasons (cheaper to compare than to build 500 rows of cells)."""
    return (old.where, old.order, old.total, old.jobs, old.waiting) == (
        new.where,
        new.order,
        new.total,
        new.jobs,
        new.waiting,
    )


def coarse_age(then: datetime, now: datetime) -> str:
    """An age in seconds for the first minute, then in whole minutes (hours past a day):
    a page of jobs changes its age column once a minute, not every second."""
    seconds = max(0.0, (now - then).total_seconds())
    if seconds < 60:
        return f"{int(seconds)}s"
    if seconds < 24 * 3600:
        return (
            f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
            if seconds >= 3600
            else f"{int(seconds // 60)}m"
        )
    return age(then, now)


def lease_left(job: Job, now: datetime) -> float:
    if not job.state.live or job.lease_expires_at is None:
        return float("inf")
    return (job.lease_expires_at - now).total_seconds()


Order = Callable[[Job, datetime], Any]
# the view's orders, in the order `s` cycles them: the page is cut in that order on the
# server, and sorted again by the key as it stands on screen (the rows of the old page
# while the new one is read)
SORTS: tuple[tuple[JobOrder, str, Order | None], ...] = (
    (JobOrder.NEWEST, "newest first", None),  # the page's own order
    (JobOrder.OLDEST, "oldest first", lambda j, _now: (j.created_at, j.id)),
    (JobOrder.STATE, "by state", lambda j, _now: (STATE_ORDER.index(j.state), -j.id)),
    (JobOrder.LEASE, "least lease left first", lambda j, now: (lease_left(j, now), -j.id)),
    (
        JobOrder.LOST,
        "most lost/reassigned first",
        lambda j, _now: (-(j.lost_count + j.reassign_count), -j.id),
    ),
)


def lease(job: Job, now: datetime) -> Cell:
    """Lease left, to the second within a minute of expiry (where it matters), else in
    whole minutes: a table whose cells change every second is redrawn every second."""
    if not job.state.live or job.lease_expires_at is None:
        return ""
    left = (job.lease_expires_at - now).total_seconds()
    shown = duration(left) if abs(left) < 60 else f"{int(left / 60)}m"
    return Text(shown, style="red" if left < 0 else "")


def waiting(explanation: Explanation) -> Text:
    """Why a queued job waits, short enough for a column: with an eligible runner it is
    only waiting its turn; with none, the reasons (the full table is in the detail)."""
    total = len(explanation.runners)
    if explanation.at_cap:
        return plain(one_line("; ".join(explanation.at_cap), 80), "yellow")
    if explanation.eligible:
        return Text(f"waiting its turn: {len(explanation.eligible)}/{total} runners eligible")
    parts = ", ".join(f"{n} {group}" for group, n in explanation.counts())
    return plain(one_line(f"no runner eligible now: {parts or 'none registered'}", 80), "red")
