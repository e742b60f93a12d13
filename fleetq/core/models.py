"""Typed edges of the queue: ids, states, and the rows the protocol returns.

States are `StrEnum`s whose members say what moves a job or runner out of them, so the
life of a job can be read here without opening the SQL.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal, NewType
from uuid import UUID

from pydantic import BaseModel, ConfigDict, JsonValue, field_validator

JobId = NewType("JobId", int)
RunnerId = NewType("RunnerId", str)  # "node/name": stable across restarts
FencingToken = NewType("FencingToken", int)  # jobs.lease_version; increases on every claim


class JobState(StrEnum):
    """Where a job is in its life."""

    WAITING = "waiting"  # on its dependencies -> queued (all succeeded), cancelled
    QUEUED = "queued"  # -> claimed (claim), cancelled (cancel)
    CLAIMED = "claimed"  # -> running (report_start), queued (reap, first loss), terminal
    RUNNING = "running"  # -> terminal (complete), queued (reap, first loss), cancelled
    SUCCEEDED = "succeeded"  # terminal
    FAILED = "failed"  # terminal: exit, timeout, lost twice, reassignments exhausted
    CANCELLED = "cancelled"  # terminal at once; "stop pending" until the runner confirms
    REFUSED = "refused"  # terminal: could not be prepared (e.g. unknown commit)

    @property
    def live(self) -> bool:
        """Held under a lease."""
        return self in (JobState.CLAIMED, JobState.RUNNING)

    @property
    def terminal(self) -> bool:
        """Will never change again."""
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.REFUSED})


class RunnerState(StrEnum):
    """A runner's state as written; a stale heartbeat also reads as offline."""

    ACTIVE = "active"  # claims work -> paused, draining (operator), offline (shutdown)
    PAUSED = "paused"  # claims nothing, keeps running jobs -> active (resume)
    DRAINING = "draining"  # claims nothing -> drained when its last job ends
    DRAINED = "drained"  # idle, by operator intent -> active (resume)
    OFFLINE = "offline"  # shut down -> active when it registers again


class Outcome(StrEnum):
    """How a runner ends a job it holds."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REFUSED = "refused"


class WriteStatus(StrEnum):
    """The answer to a fenced write."""

    OK = "ok"
    ALREADY = "already"  # the same write committed earlier; its reply was lost
    STALE = "stale"  # the lease moved on: nothing changed
    # heartbeat and outcome: another transaction holds the job's row (the runner's own
    # handler or launch, an operator's or a submitter's cancel); nothing written this
    # time, and not known to be stale: the runner tries again
    BUSY = "busy"


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class SubmitResult(_Row):
    """What submit answers: the job, and whether this call created it."""

    job_id: JobId
    created: bool
    state: JobState
    priority_class: int


class Claim(_Row):
    """A job this runner now holds, with the fencing token to present on every write."""

    job_id: JobId
    lease_version: FencingToken
    lease_expires_at: datetime
    project: str
    operation: str
    commit_sha: str
    requested_node: str | None
    payload: dict[str, Any]
    task_id: str | None
    timeout_s: int
    memory_mb: int
    cpu_millis: int
    priority_class: int
    reassign_count: int
    lost_count: int
    traceparent: str | None = None  # W3C trace context given at submit
    # how long the lease had left when the database answered, on its own clock (None: not
    # answered): the runner renews and fences this lease by it, not by its settings
    lease_left_s: float | None = None


class Unusable(_Row):
    """A job a claim took whose row this code cannot use (a payload that is not a JSON
    object, written before submit refused one; a field this model does not accept).
    The claim ends it `refused` with `reason` under its token, so one bad row neither
    stops its claimant nor takes the rest of the batch down with it."""

    job_id: JobId
    lease_version: FencingToken
    reason: str


class HeartbeatResult(_Row):
    """One job's answer to a heartbeat."""

    job_id: JobId
    status: WriteStatus
    lease_expires_at: datetime | None
    lease_left_s: float | None = None  # a renewed lease's time left, on the database's clock


class JobWrite(_Row):
    """One job's answer to a batched fenced write."""

    job_id: JobId
    status: WriteStatus


class OutcomeReport(_Row):
    """An outcome to record for a job held under `lease_version`."""

    job_id: JobId
    lease_version: FencingToken
    outcome: Outcome
    exit_code: int | None = None
    reason: str | None = None
    log_tail: str = ""
    prepare_ms: int | None = None
    run_ms: int | None = None
    # When the process (or handler) ended, on this process's `time.monotonic()` clock:
    # sent as "milliseconds ago" so the database dates the end on its own clock.
    ended_monotonic: float | None = None
    # what the verdict rests on besides the commit (fleetq/runner/provenance.py); None: not
    # gathered (a refusal before anything ran)
    provenance: dict[str, Any] | None = None

    @field_validator("reason", "log_tail")
    @classmethod
    def _storable(cls, value: str | None) -> str | None:
        """PostgreSQL text cannot hold NUL, which job output may contain (`find -print0`):
        one such tail made the whole outcome batch fail, again and again."""
        return value.replace("\x00", "\ufffd") if value else value


class CancelResult(_Row):
    """What cancel did."""

    job_id: JobId
    previous_state: JobState
    state: JobState
    stop_pending: bool


class ReapResult(_Row):
    """One reaper pass: jobs requeued, jobs failed, and whether this caller led."""

    requeued: int
    failed: int
    leader: bool


class Job(_Row):
    """A job as readers see it."""

    id: JobId
    project: str
    operation: str
    commit_sha: str
    lane: str
    capabilities: list[str]
    memory_mb: int
    cpu_millis: int
    timeout_s: int
    requested_node: str | None
    idempotency_key: str | None
    task_id: str | None
    submitted_by: str
    priority_class: int
    state: JobState
    lease_owner: str | None
    lease_version: int
    lease_expires_at: datetime | None
    reserved_on: str | None
    lost_count: int
    reassign_count: int
    failure_reason: str | None
    cancelled_by: str | None
    cancel_reason: str | None = None
    released_by: str | None = None  # the runner whose outcome, loss or hand-back ended it
    # As stored: any JSON value. Submit accepts only an object, but rows written before
    # it refused other values are still read, and a reader must show them, not fail.
    payload: JsonValue = {}
    created_at: datetime
    claimed_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    waiting_on: list[JobId] = []  # while waiting: its dependencies not yet succeeded
    traceparent: str | None = None  # W3C trace context given at submit
    attempts: int = 1  # application attempts (retries counted apart from losses)
    retry_at: datetime | None = None  # while waiting to be tried again
    promotions: int = 0  # priority classes gained by aging

    @property
    def stop_pending(self) -> bool:
        """Cancelled, but the runner has not yet confirmed its execution stopped."""
        return self.state == JobState.CANCELLED and self.reserved_on is not None


class Runner(_Row):
    """A runner with its lanes and live capacity."""

    id: RunnerId
    node: str
    name: str
    capabilities: list[str]
    memory_mb: int
    cpu_millis: int
    reserved_memory_mb: int
    reserved_cpu_millis: int
    state: RunnerState
    offline: bool  # state offline, or heartbeat older than the offline threshold
    state_reason: str | None
    state_actor: str | None
    state_changed_at: datetime
    last_heartbeat_at: datetime
    stale_rejections: int  # zombie writes refused (its lease had moved on)
    self_races: int = 0  # refused writes that raced its own committed outcome
    lanes: dict[str, list[int]]  # lane -> [slots, slots used]
    live_jobs: int


class Event(_Row):
    """One row of the append-only history."""

    id: int
    at: datetime
    kind: str
    job_id: JobId | None
    runner_id: str | None
    lease_version: int | None
    actor: str | None
    detail: dict[str, Any]


class Result(_Row):
    """The latest recorded verdict for (project, commit, operation)."""

    project: str
    commit_sha: str
    operation: str
    job_id: JobId
    verdict: str
    exit_code: int | None
    reason: str | None
    log_tail: str
    recorded_at: datetime
    # what it rests on besides the commit (fleetq/core/provenance.py), None before 0041
    provenance: dict[str, Any] | None = None


class ResultAnswer(_Row):
    """What the result reader says about one operation at a commit: its newest verdict,
    and apart from it a newer job that decided nothing (yet)."""

    operation: str
    # a verdict (passed, failed, error, refused), else: live, cancelled, none
    status: str
    job_id: JobId | None = None
    job_state: JobState | None = None
    exit_code: int | None = None
    reason: str | None = None
    recorded_at: datetime | None = None
    log_tail: str = ""  # the end of the run's output, as recorded with the verdict
    newer_job_id: JobId | None = None  # a newer job, live or cancelled, beside the verdict
    newer_state: JobState | None = None
    # what the verdict rests on besides the commit: runner, machine, tools, lockfiles,
    # staging, the operation as run, test counts (fleetq/core/provenance.py)
    provenance: dict[str, Any] | None = None


VERDICTS = ("passed", "failed", "error", "refused")  # what a check can decide
Decision = Literal["passed", "failed", "error", "pending"]


def decision(answers: list[ResultAnswer]) -> Decision:
    """What answers say of a commit as a whole, the word a gate acts on (the CLI's exit
    status, the API's `status`): `failed` when a check ran and failed; else `error` when
    one could not run (error, refused); else `pending` while one has decided nothing
    (live, cancelled, never asked); else `passed`."""
    statuses = {a.status for a in answers}
    if "failed" in statuses:
        return "failed"
    if statuses & {"error", "refused"}:
        return "error"
    if not answers or statuses - {"passed"}:
        return "pending"
    return "passed"


class Registration(_Row):
    """What a runner declares when it registers."""

    node: str
    name: str
    capabilities: list[str] = []
    memory_mb: int
    cpu_millis: int
    lanes: dict[str, int]  # lane -> slots
    version: str = ""
    pid: int | None = None


class StartReport(_Row):
    """What a runner reports once it launched a job's process."""

    job_id: JobId
    lease_version: FencingToken
    node: str
    run_id: UUID
    pid: int | None
    process_started_at: datetime | None
    prepare_ms: int | None = None
