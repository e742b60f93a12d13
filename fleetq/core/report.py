"""A run's figures: what `fleetq stats` measures, restricted to the jobs one run submitted.

Why a separate reader: a demo (or any scripted run) shares its database with earlier
runs, and its verdict ("every job accounted for", "the overlap was measured") must be
about its own jobs only. Every query here takes the run's job ids; an id the database no
longer knows is a lost job, which is what the verdict is for.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from fleetq.core import leasing, queries, stats
from fleetq.core.driver import Driver
from fleetq.core.models import JobId

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "refused"})


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True)


class StateCount(_Row):
    """Jobs in one state (and, for failures, one reason)."""

    state: str
    reason: str
    jobs: int


class LiveJob(_Row):
    """A job not yet terminal, with its current execution if it launched."""

    job_id: JobId
    project: str
    operation: str
    state: str
    lease_owner: str | None
    lease_version: int
    launched_at: datetime | None
    running_s: float | None


class QueueWait(_Row):
    """Submit to first claim, for one priority class and project."""

    priority_class: int
    project: str
    jobs: int
    p50_s: float
    p95_s: float
    max_s: float


class Phases(_Row):
    """Prepare apart from run time, for one operation (milliseconds)."""

    operation: str
    runs: int
    prepare_p50_ms: float | None
    prepare_max_ms: int | None
    run_p50_ms: float | None
    run_max_ms: int | None


class Placement(_Row):
    """Claims of one operation by one runner."""

    runner_id: str
    operation: str
    claims: int


class Completed(_Row):
    """Outcomes recorded in one interval of the run (bucket 0 starts at the run's start)."""

    bucket: int
    succeeded: int
    failed: int


class Recovery(_Row):
    """One lease expiry or loss, and the claim that took the job up again."""

    job_id: JobId
    kind: str
    lost_by: str | None
    lease_version: int | None
    at: datetime
    claimed_again_at: datetime | None
    claimed_by: str | None
    delay_s: float | None


class Stop(_Row):
    """An execution stopped before its end, and whether the stop was confirmed."""

    job_id: JobId
    lease_version: int
    runner_id: str
    stop_reason: str
    stop_confirmed: bool
    signal: int | None
    ended_at: datetime | None


class RunnerRow(_Row):
    """A runner as the database sees it."""

    id: str
    pid: int | None
    state: str
    stale: bool


class RunFigures(_Row):
    """Everything the run's report prints, read at one moment."""

    read_at: datetime
    accepted: int
    states: list[StateCount]
    live: list[LiveJob]
    queue_wait: list[QueueWait]
    phases: list[Phases]
    placement: list[Placement]
    completed: list[Completed]
    interval_s: float
    recoveries: list[Recovery]
    stops: list[Stop]
    overlaps: list[stats.Overlap]
    stale_rejections: dict[str, int]  # zombie writes, by kind of write
    self_races: int = 0  # refused writes that raced the writer's own outcome
    ledger_writes: int
    ledger_refused: int
    ledger_violations: int
    ledger_duplicates: int = 0  # jobs with effects accepted under two tokens or more

    @property
    def found(self) -> int:
        """Accepted jobs the database still knows."""
        return sum(s.jobs for s in self.states)

    @property
    def lost(self) -> int:
        """Accepted jobs the database does not know: must be 0."""
        return self.accepted - self.found

    @property
    def unsettled(self) -> int:
        """Accepted jobs not yet terminal (queued, claimed or running)."""
        return sum(s.jobs for s in self.states if s.state not in TERMINAL)

    def superseded_confirmed(self) -> list[Stop]:
        """Superseded executions whose runner confirmed the stop."""
        return [s for s in self.stops if s.stop_reason == "superseded" and s.stop_confirmed]


async def clock(driver: Driver) -> datetime:
    """The database's time now."""
    (row,) = await driver.fetch(queries.sql("report_clock"))
    now = row["now"]
    assert isinstance(now, datetime)
    return now


async def states(driver: Driver, jobs: Sequence[int]) -> list[StateCount]:
    """The jobs by state and failure reason."""
    rows = await driver.fetch(queries.sql("report_states"), list(jobs))
    return [StateCount.model_validate(r) for r in rows]


async def live(driver: Driver, jobs: Sequence[int]) -> list[LiveJob]:
    """The jobs not yet terminal, the most recently launched first."""
    rows = await driver.fetch(queries.sql("report_live"), list(jobs))
    return [LiveJob.model_validate(r) for r in rows]


async def stops(driver: Driver, jobs: Sequence[int]) -> list[Stop]:
    """Executions of the jobs stopped before their end, confirmed or not yet."""
    rows = await driver.fetch(queries.sql("report_stops"), list(jobs))
    return [Stop.model_validate(r) for r in rows]


async def runners(driver: Driver, ids: Sequence[str]) -> list[RunnerRow]:
    """The named runners as registered."""
    rows = await driver.fetch(queries.sql("report_runners"), list(ids))
    return [RunnerRow.model_validate(r) for r in rows]


async def gather(
    driver: Driver, jobs: Sequence[int], *, start: datetime, interval_s: float
) -> RunFigures:
    """Read every figure of the run; `interval_s` sizes the completed-per-interval rows."""
    ids = sorted(set(jobs))
    found = set(ids)

    async def rows(name: str, *args: object) -> list[dict[str, Any]]:
        return await driver.fetch(queries.sql(name), ids, *args)

    (ledger,) = await rows("report_ledger")
    return RunFigures(
        read_at=await clock(driver),
        accepted=len(ids),
        states=await states(driver, ids),
        live=await live(driver, ids),
        queue_wait=[QueueWait.model_validate(r) for r in await rows("report_queue_wait")],
        phases=[Phases.model_validate(r) for r in await rows("report_phases")],
        placement=[Placement.model_validate(r) for r in await rows("report_placement")],
        completed=[
            Completed.model_validate(r) for r in await rows("report_completed", start, interval_s)
        ],
        interval_s=interval_s,
        recoveries=[Recovery.model_validate(r) for r in await rows("report_recoveries")],
        stops=await stops(driver, ids),
        overlaps=[o for o in await stats.overlaps(driver) if o.job_id in found],
        stale_rejections={
            str(r["write"]): int(r["rejections"]) for r in await rows("report_stale")
        },
        self_races=int((await rows("report_self_races"))[0]["self_races"]),
        ledger_writes=int(ledger["writes"]),
        ledger_refused=int(ledger["refused"]),
        ledger_violations=await leasing.fenced_violations(driver),
        ledger_duplicates=await leasing.fenced_duplicates(driver),
    )
