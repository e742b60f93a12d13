"""The console's jobs view as the database answers it: a filter, an order, a page.

The page is cut on the server in the order the operator chose, so "oldest first" shows
the oldest jobs of the whole match, not the oldest of the newest page.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from fleetq.core import eligibility, queries
from fleetq.core.driver import Driver
from fleetq.core.models import Job, JobId, JobState
from fleetq.core.views import now

COUNT_CAP = 100_000  # the jobs view counts matches up to this


class JobFilter(BaseModel):
    """The jobs view's filter; each field optional."""

    model_config = ConfigDict(frozen=True)

    state: JobState | None = None
    lane: str | None = None
    project: str | None = None
    runner: str | None = None
    reassigned: bool = False  # only jobs reassigned at least once (an incident's trail)
    lost: bool = False  # only jobs lost at least once
    word: str | None = None  # a job id, commit prefix, operation, project or submitter

    def arguments(self) -> tuple[object, ...]:
        """The filter as views_jobs' first seven parameters."""
        return (
            self.state.value if self.state else None,
            self.lane,
            self.project,
            self.runner,
            self.reassigned,
            self.lost,
            self.word,
        )


class JobOrder(StrEnum):
    """The orders the jobs view cuts its page in (`s` cycles them)."""

    NEWEST = "newest"
    OLDEST = "oldest"
    STATE = "state"
    LEASE = "lease"  # least lease left first
    LOST = "lost"  # most lost or reassigned first


# "by state": what runs first, then what waits, then how jobs ended (failures before
# successes); alphabetical put claimed, then cancelled and failed, before running
STATE_ORDER = (
    JobState.RUNNING,
    JobState.CLAIMED,
    JobState.QUEUED,
    JobState.WAITING,
    JobState.FAILED,
    JobState.REFUSED,
    JobState.CANCELLED,
    JobState.SUCCEEDED,
)


class JobPage(BaseModel):
    """A page of jobs with, for each queued one, why it waits."""

    model_config = ConfigDict(frozen=True)

    now: datetime
    where: JobFilter  # the filter this page answers
    order: JobOrder = JobOrder.NEWEST  # the order it was cut in
    jobs: list[Job]
    total: int  # jobs matching the filter, beyond the page too (at most COUNT_CAP)
    waiting: dict[JobId, eligibility.Explanation]


async def job_page(
    driver: Driver,
    where: JobFilter,
    *,
    order: JobOrder = JobOrder.NEWEST,
    limit: int = 500,
    at: datetime | None = None,
) -> JobPage:
    """The first `limit` jobs matching `where` in `order`; queued ones get their
    explanation. Newest first reads the primary key's index; the others sort the match."""
    at = at or await now(driver)
    if order == JobOrder.NEWEST:
        rows = await driver.fetch(queries.sql("views_jobs"), *where.arguments(), limit)
    else:
        states = [s.value for s in STATE_ORDER]
        rows = await driver.fetch(
            queries.sql("views_jobs_sorted"), *where.arguments(), limit, order.value, states
        )
    jobs = [Job.model_validate(r) for r in rows]
    (count,) = await driver.fetch(queries.sql("views_jobs_count"), *where.arguments(), COUNT_CAP)
    queued = [j for j in jobs if j.state == JobState.QUEUED]
    return JobPage(
        now=at,
        where=where,
        order=order,
        jobs=jobs,
        total=int(count["total"]),
        waiting=await eligibility.explain_many(driver, queued),
    )


async def job_ids(driver: Driver, where: JobFilter) -> list[JobId]:
    """Every job matching `where`, newest first, without the page's limit."""
    rows = await driver.fetch(queries.sql("views_job_ids"), *where.arguments())
    return [JobId(int(r["id"])) for r in rows]
