"""What the fleet did: overlap windows (two executions of one job alive at once), queue
wait by project and priority class, recovery delay after expiry or loss."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from fleetq.core import queries
from fleetq.core.driver import Driver
from fleetq.core.models import JobId


class Overlap(BaseModel):
    """A window in which two executions of one job were alive at once."""

    model_config = ConfigDict(frozen=True)

    job_id: JobId
    older_token: int
    newer_token: int
    older_runner: str
    newer_runner: str
    started_at: datetime
    ended_at: datetime | None  # None: both may still be running
    open: bool
    end_confirmed: bool
    end_measured: bool  # False: the end (and so the length) is only an upper bound
    older_stop_reason: str | None
    older_open: bool = False  # the older run has no recorded end (its runner went silent)

    def seconds(self, now: datetime) -> float:
        """The window's length (up to `now` while it is open)."""
        return ((self.ended_at or now) - self.started_at).total_seconds()

    @property
    def happened(self) -> bool:
        """Whether two runs of the job are known to have run at once: the window is
        open (both may still run) or its end was measured. A bounded window may never
        have happened: the older run's end was not seen (its runner was killed, frozen
        or cut off), and may lie before the newer run's start."""
        return self.open or self.end_measured

    def unseen(self) -> str:
        """Why a bounded window's end is only an upper bound, for a person."""
        if self.older_open:
            return f"t{self.older_token} has no end recorded: its runner was killed or cut off"
        why = {
            "lost": "its runner lost it (restarted, or cut off)",
            "superseded": "stopped late, after its runner came back",
            "self_fenced": "its runner fenced it while cut off",
            "cancelled": "stopped late, after a cancel",
        }.get(self.older_stop_reason or "", "recorded late")
        return f"t{self.older_token}'s end not seen: {why}"


class QueueWait(BaseModel):
    """Queue wait for one project and priority class."""

    project: str
    priority_class: int
    jobs: int
    p50_s: float
    p95_s: float
    max_s: float


class Recovery(BaseModel):
    """Expiries and losses, and how long until the job was claimed again."""

    incidents: int
    recovered: int
    p50_s: float | None
    max_s: float | None


class Flaky(BaseModel):
    """A test that failed and then passed at one commit (its check's JUnit reports)."""

    project: str
    operation: str
    test: str
    commits: int  # where it flipped
    last_passed_at: datetime


FLAKY_SHOWN = 20


class Stats(BaseModel):
    """`fleetq stats`."""

    states: dict[str, int]
    queue_wait: list[QueueWait]
    duplicate_execution_incidents: int  # windows that happened (open, or measured)
    open_overlaps: int
    possible_overlaps: int = 0  # bounded windows: at most this long, maybe none at all
    recovery: Recovery
    stale_rejections: int  # zombie writes: the writer's lease had moved on
    self_races: int = 0  # refused writes that raced the writer's own committed outcome
    flaky: list[Flaky] = []  # failed, then passed at the same commit: most commits first


async def overlaps(
    driver: Driver,
    *,
    open_only: bool = False,
    job_id: JobId | None = None,
    project: str | None = None,
) -> list[Overlap]:
    """Overlap windows, oldest first (of one job, or one project's jobs, when given)."""
    rows = await driver.fetch(queries.sql("stats_overlaps"), open_only, job_id, project)
    return [Overlap.model_validate(row) for row in rows]


async def stats(driver: Driver, *, project: str | None = None) -> Stats:
    """The fleet's figures (of one project's jobs, when given)."""
    found = await overlaps(driver, project=project)
    states = {
        r["state"]: int(r["jobs"]) for r in await driver.fetch(queries.sql("stats_states"), project)
    }
    waits = [
        QueueWait.model_validate(r)
        for r in await driver.fetch(queries.sql("stats_queue_wait"), project)
    ]
    (recovery,) = await driver.fetch(queries.sql("stats_recovery"), project)
    (stale,) = await driver.fetch(queries.sql("stats_stale"), project)
    return Stats(
        states=states,
        queue_wait=waits,
        duplicate_execution_incidents=sum(o.happened for o in found),
        open_overlaps=sum(o.open for o in found),
        possible_overlaps=sum(not o.happened for o in found),
        recovery=Recovery.model_validate(recovery),
        stale_rejections=int(stale["stale_rejections"]),
        self_races=int(stale["self_races"]),
        flaky=[
            Flaky.model_validate(r)
            for r in await driver.fetch(queries.sql("stats_flaky"), project, FLAKY_SHOWN)
        ],
    )
