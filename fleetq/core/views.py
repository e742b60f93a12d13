"""Read models for the operator's console: bounded reads that answer one screen each.

Each function returns plain pydantic values stamped with the database's clock, so the
console computes ages and countdowns from database time, and a test can pin that clock
(`now=`) to render the same screen every run.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict

from fleetq.core import eligibility, fleet, queries, readers, stats, validation
from fleetq.core import output as job_output
from fleetq.core.driver import Driver
from fleetq.core.models import CancelResult, Event, Job, JobId, Runner

THROUGHPUT_BUCKET_S = 60
THROUGHPUT_BUCKETS = 30
QUEUE_WAIT_WINDOW_S = 15 * 60
OVERLAPS_SHOWN = 20  # open overlap windows read for the alert strip
ALERT_JOBS = 50  # the jobs each overview alert lists at most (to open one)
HISTORY_MINUTES = 60  # queue history shown, one sample a minute


class _View(BaseModel):
    model_config = ConfigDict(frozen=True)


class LaneRow(_View):
    """One lane's live depth and capacity."""

    lane: str
    queued: int
    claimed: int
    running: int
    stop_pending: int
    slots: int  # of online runners
    slots_used: int  # of those, held by live jobs and by stops still pending
    runners: int
    eligible_runners: int
    oldest_queued_at: datetime | None


class ClassWait(_View):
    """Queue wait of one priority class over the recent window."""

    priority_class: int
    jobs: int
    p50_s: float
    p95_s: float


class LaneHistory(_View):
    """One lane and priority class over the last HISTORY_MINUTES, one value a minute,
    oldest first; None where no sample was written (no runner led the reaper then)."""

    lane: str
    priority_class: int
    queued: list[int | None]
    oldest_wait_s: list[float | None]
    claimed: list[int | None]
    wait_p50_s: list[float | None]  # None also for a minute without claims

    @property
    def active(self) -> bool:
        """Anything queued or claimed in the window (a quiet class is not worth a line)."""
        return any(self.queued) or any(self.claimed)


_HISTORY_COLUMNS = ("queued", "oldest_wait_s", "claimed", "wait_p50_s")


def _histories(rows: list[dict[str, Any]], now: datetime) -> list[LaneHistory]:
    """Samples (ordered by lane, class, minute) placed on the window's minutes."""
    last = now.replace(second=0, microsecond=0)
    series: dict[tuple[str, int], dict[str, list[Any]]] = {}
    for row in rows:
        key = (str(row["lane"]), int(row["priority_class"]))
        columns = series.setdefault(
            key, {name: [None] * HISTORY_MINUTES for name in _HISTORY_COLUMNS}
        )
        index = HISTORY_MINUTES - 1 - int((last - row["at"]).total_seconds() // 60)
        if 0 <= index < HISTORY_MINUTES:
            for name in _HISTORY_COLUMNS:
                columns[name][index] = row[name]
    return [
        LaneHistory(lane=lane, priority_class=cls, **columns)
        for (lane, cls), columns in series.items()
    ]


class Alerts(_View):
    """What needs an operator's eye now."""

    offline_runners: list[str]
    open_overlaps: list[stats.Overlap]
    stops_pending: int
    stops_unconfirmed: int
    unplaceable: int  # queued jobs that no registered runner could take even when idle
    unplaceable_jobs: list[JobId] = []  # the first ALERT_JOBS of them, by id

    @property
    def quiet(self) -> bool:
        """Nothing to look at."""
        return not (
            self.offline_runners
            or self.open_overlaps
            or self.stops_pending
            or self.stops_unconfirmed
            or self.unplaceable
        )


class Overview(_View):
    """The fleet at a glance."""

    now: datetime
    lanes: list[LaneRow]
    waits: list[ClassWait]
    throughput: list[int]  # jobs finished per bucket, oldest first
    runners: list[Runner]
    alerts: Alerts
    history: list[LaneHistory] = []  # by lane, then class

    def lane_history(self, lane: str) -> list[LaneHistory]:
        """The lane's classes, class 0 first."""
        return [h for h in self.history if h.lane == lane]

    def queued_history(self, lane: str) -> list[int | None]:
        """The lane's queue depth a minute, all classes together."""
        total: list[int | None] = [None] * HISTORY_MINUTES
        for h in self.lane_history(lane):
            for i, value in enumerate(h.queued):
                if value is not None:
                    total[i] = (total[i] or 0) + value
        return total


class ExecutionRow(_View):
    """One execution (one fencing token) of a job."""

    job_id: JobId
    lease_version: int
    runner_id: str
    node: str
    run_id: UUID | None  # a handler's has none: it launched no process (migration 0026)
    pid: int | None
    claimed_at: datetime | None
    launched_at: datetime | None
    start_reported_at: datetime | None
    ended_at: datetime | None
    end_measured: bool  # dated from the runner's clock of the exit, not when recorded
    exit_code: int | None
    signal: int | None
    stop_reason: str | None
    stop_requested_at: datetime | None
    stop_confirmed: bool


class JobDetail(_View):
    """Everything the job detail view shows."""

    now: datetime
    job: Job
    explanation: eligibility.Explanation
    executions: list[ExecutionRow]
    overlaps: list[stats.Overlap]
    events: list[Event]
    lease_seconds: int
    output: str | None  # the recorded log tail, untrusted text
    provenance: dict[str, Any] | None = None  # what its verdict rests on (core/provenance.py)
    flaky: list[str] = []  # tests that failed, then passed, at its check (views_job_flaky)
    runs_output: list[job_output.RunOutput] = []  # the newest shipped output, by run
    max_attempts: int = 1  # its operation's retry policy (1: no retries)
    reassignment_cap: int | None = None  # the fleet's, shared by expiries and self-fences


async def now(driver: Driver) -> datetime:
    """The database's clock."""
    (row,) = await driver.fetch(queries.sql("views_now"))
    value: datetime = row["now"]
    return value


async def overview(driver: Driver, *, at: datetime | None = None) -> Overview:
    """Lanes, queue wait, throughput, runners and alerts, in one pass."""
    at = at or await now(driver)
    runners = await fleet.runners(driver)
    (alert,) = await driver.fetch(queries.sql("views_alerts"), ALERT_JOBS)
    throughput = await driver.fetch(
        queries.sql("views_throughput"), at, THROUGHPUT_BUCKET_S, THROUGHPUT_BUCKETS
    )
    return Overview(
        now=at,
        lanes=[LaneRow.model_validate(r) for r in await driver.fetch(queries.sql("views_lanes"))],
        waits=[
            ClassWait.model_validate(r)
            for r in await driver.fetch(queries.sql("views_queue_wait"), at, QUEUE_WAIT_WINDOW_S)
        ],
        throughput=[int(r["finished"]) for r in throughput],
        runners=runners,
        history=_histories(
            await driver.fetch(queries.sql("views_queue_history"), at, HISTORY_MINUTES), at
        ),
        alerts=Alerts(
            offline_runners=[r.id for r in runners if r.offline],
            open_overlaps=[
                window
                for job_id in alert["overlapping_jobs"][:OVERLAPS_SHOWN]
                for window in await stats.overlaps(driver, open_only=True, job_id=job_id)
            ],
            stops_pending=int(alert["stops_pending"]),
            stops_unconfirmed=int(alert["stops_unconfirmed"]),
            unplaceable=int(alert["unplaceable"]),
            unplaceable_jobs=[JobId(j) for j in alert["unplaceable_jobs"]],
        ),
    )


async def job_detail(driver: Driver, job_id: JobId, *, at: datetime | None = None) -> JobDetail:
    """A job with its eligibility, executions, overlap windows and history."""
    at = at or await now(driver)
    job = await readers.job(driver, job_id)
    (lease,) = await driver.fetch(queries.sql("runners_lease_seconds"))
    output = await driver.fetch(queries.sql("views_job_output"), job_id)
    budgets = await driver.fetch(queries.sql("views_job_budgets"), job_id)
    return JobDetail(
        now=at,
        job=job,
        explanation=await eligibility.explain(driver, job_id),
        executions=[
            ExecutionRow.model_validate(r)
            for r in await driver.fetch(queries.sql("views_executions"), job_id)
        ],
        overlaps=await stats.overlaps(driver, job_id=job_id),
        events=await readers.events(driver, job_id=job_id, limit=500),
        lease_seconds=int(lease["lease_seconds"]),
        output=str(output[0]["log_tail"]) if output else None,
        provenance=output[0]["provenance"] if output else None,
        flaky=[r["test"] for r in await driver.fetch(queries.sql("views_job_flaky"), job_id)],
        runs_output=await job_output.newest(driver, job_id),
        max_attempts=int(budgets[0]["max_attempts"]) if budgets else 1,
        reassignment_cap=int(budgets[0]["reassignment_cap"]) if budgets else None,
    )


class Access(_View):
    """What the console's login may do: a reader login may neither cancel nor steer."""

    login: str
    may_cancel: bool
    may_steer: bool


class Heartbeat(_View):
    """A runner's last heartbeat, read alone once a second for the ages on screen."""

    id: str
    last_heartbeat_at: datetime
    offline: bool


class AlertJob(_View):
    """A job behind an overview alert (a pending or unconfirmed stop, an open overlap, a
    queued job no runner can take)."""

    job_id: JobId
    alert: str
    runner_id: str | None


class EventQuery(_View):
    """An incident search over the whole history; each field optional."""

    runner: str | None = None
    job: JobId | None = None
    kind: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    @property
    def empty(self) -> bool:
        """No field set: the live tail, not a search."""
        return self == EventQuery()


async def access(driver: Driver) -> Access:
    """Whether this login may cancel jobs and steer runners (privileges, not guesses)."""
    (row,) = await driver.fetch(queries.sql("views_may_act"))
    return Access.model_validate(row)


async def heartbeats(driver: Driver) -> list[Heartbeat]:
    """Every listed runner's last heartbeat and whether it is offline now."""
    return [
        Heartbeat.model_validate(r) for r in await driver.fetch(queries.sql("views_heartbeats"))
    ]


async def cancel_many(
    driver: Driver, job_ids: list[JobId], *, actor: str, reason: str
) -> list[CancelResult]:
    """Cancel `job_ids` in one statement, each exactly as `fleetq cancel` would."""
    rows = await driver.fetch(
        queries.sql("views_cancel_many"),
        [int(j) for j in job_ids],
        validation.text(actor, "actor"),
        validation.reason(reason),
    )
    return [CancelResult.model_validate(r) for r in rows]


async def search_events(
    driver: Driver, query: EventQuery, *, below: int | None = None, limit: int = 200
) -> list[Event]:
    """One page of matching events, newest first, below the id `below` (None: newest)."""
    rows = await driver.fetch(
        queries.sql("views_events_search"),
        query.runner,
        query.job,
        query.kind,
        query.since,
        query.until,
        below,
        limit,
    )
    return [Event.model_validate(r) for r in rows]


async def runner_hour(
    driver: Driver, runner: str, since: datetime
) -> list[tuple[str, int, datetime]]:
    """How many events of each kind name `runner` since `since`: (kind, count, last)."""
    rows = await driver.fetch(queries.sql("views_runner_hour"), runner, since)
    return [(str(r["kind"]), int(r["events"]), r["last_at"]) for r in rows]


async def alert_jobs(driver: Driver, alerts: Alerts | None = None) -> list[AlertJob]:
    """The jobs behind the alerts: pending and unconfirmed stops, open overlaps, and the
    queued jobs no runner can take, which `alerts` (the overview's, read with them) names;
    without it they are read here."""
    rows = await driver.fetch(queries.sql("views_alert_jobs"), ALERT_JOBS)
    if alerts is None:
        (alert,) = await driver.fetch(queries.sql("views_alerts"), ALERT_JOBS)
        unplaceable = [JobId(j) for j in alert["unplaceable_jobs"]]
    else:
        unplaceable = alerts.unplaceable_jobs
    return [AlertJob.model_validate(r) for r in rows] + [
        AlertJob(job_id=job, alert="no runner can take it", runner_id=None) for job in unplaceable
    ]
