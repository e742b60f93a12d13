"""The lease protocol: how a runner holds a job, and why a zombie can never write.

1. **Claim.** One statement (`fleetq.claim`) picks eligible queued jobs with
   `FOR NO KEY UPDATE SKIP LOCKED` in `priority_class, created_at, id` order, sets
   `lease_owner`, increments `lease_version` (the fencing token) and sets
   `lease_expires_at = clock_timestamp() + lease`, and reserves the runner's slots,
   memory and CPUs, all in one transaction. Once it holds jobs it locks the runner's row,
   so claims of one runner serialize and a batch never over-reserves; CHECKs make it
   impossible anyway.
   A claim carries a client-made claim id; retrying it returns what it already took.
2. **Fenced writes.** Heartbeat, start report, outcome and loss name
   `(job id, lease_owner, lease_version)` and the live states. When any moved on (the job
   was cancelled, expired and was reclaimed), the write changes 0 rows and the caller gets
   `WriteStatus.STALE` (single-job calls raise `StaleLease`). It never silently succeeds.
3. **Ambiguous commits.** A write whose reply was lost may be retried by the same
   (owner, token): if it had committed, the answer is `ALREADY`, not stale, so a success
   is never misread as a loss.
4. **Time is the database's.** Expiry is `clock_timestamp()`-based; runners never compare
   their own clocks with `lease_expires_at`.
5. **Expiry** (`fleetq.reap`, one leader: the pass locks the `reaper` row of
   `fleetq.coordination`, which only fleetq's functions can lock, never an advisory key)
   returns expired jobs to the queue and counts a reassignment; past `reassignment_cap` the
   job fails (`reassignments_exhausted`). The next claim bumps the token.
6. **Explicit loss** (`report_lost`) requeues once, then fails with reason `lost`; expiry
   never touches that counter.
7. **Ends on the database's clock.** A write that ends an execution (outcome, confirmed
   stop, release) carries how long ago, on the runner's monotonic clock read as the
   request is sent, its process ended; the database records its own time minus that.
   An end recorded when a partition healed no longer stretches an overlap window.
8. **Cancellation is not a stop.** Cancel makes the job terminal at once and ends the
   lease, but the runner's capacity stays reserved until it confirms the stop
   (`confirm_stop`): until then the job shows "stop pending".
9. **A row no claimant can use is refused, not raised.** Claimed rows are read one by
   one; a row the `Claim` model does not accept (a payload that is not a JSON object,
   written before submit refused it) is ended `refused` with the reason under its own
   token before the claim returns (`Claims.refused`). Raising instead stopped every
   runner of the lane at each claim of that job, and took the rest of its batch along.

Exactly-once holds only for effects written in the same transaction as the outcome; see
docs/guarantees.md for what the fencing token does and does not buy.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from fleetq.core import queries
from fleetq.core.db import UnreadableJSON
from fleetq.core.driver import Driver
from fleetq.core.errors import InvalidInput, StaleLease
from fleetq.core.models import (
    Claim,
    FencingToken,
    HeartbeatResult,
    JobId,
    JobWrite,
    Outcome,
    OutcomeReport,
    ReapResult,
    RunnerId,
    StartReport,
    Unusable,
    WriteStatus,
)
from fleetq.core.validation import payload as payload_json


def check(status: WriteStatus | str, *, job_id: int, token: int, write: str) -> WriteStatus:
    """Raise `StaleLease` for a stale answer; return ok/already as they are."""
    answer = WriteStatus(status)
    if answer is WriteStatus.STALE:
        raise StaleLease(job_id, token, write)
    return answer


class Claims(list[Claim]):
    """The jobs a claim took that can run, in claim order; `refused` are the jobs it
    took and could not use, already ended `refused` under their tokens (protocol §9)."""

    def __init__(self, claims: Iterable[Claim] = (), refused: Iterable[Unusable] = ()) -> None:
        super().__init__(claims)
        self.refused = list(refused)

    @property
    def taken(self) -> int:
        """Every job the claim took, usable or not: what its `limit` counted."""
        return len(self) + len(self.refused)


def parse_claim(row: Mapping[str, Any]) -> Claim | Unusable:
    """A claimed row as a `Claim`, or as `Unusable` saying why it cannot be one."""
    try:
        return Claim.model_validate(row)
    except ValidationError as exc:
        problems = "; ".join(_problem(error) for error in exc.errors(include_url=False))
        return Unusable(
            job_id=JobId(int(row["job_id"])),
            lease_version=FencingToken(int(row["lease_version"])),
            reason=f"unusable job: {problems}"[:500],
        )


def _problem(error: ErrorDetails) -> str:
    """One validation error in words, naming the value's JSON type but never the value
    (a payload may hold secrets)."""
    field = ".".join(str(part) for part in error["loc"]) or "row"
    if error["type"] == "dict_type":
        return f"{field} must be a JSON object, not {_json_kind(error['input'])}"
    return f"{field}: {error['msg']} (got {_json_kind(error['input'])})"


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, UnreadableJSON):
        return value.why
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


async def _usable(driver: Driver, runner: RunnerId, rows: Sequence[Mapping[str, Any]]) -> Claims:
    """Claimed rows read one by one; those that cannot be used are refused now."""
    parsed = [parse_claim(row) for row in rows]
    claims = Claims(
        (c for c in parsed if isinstance(c, Claim)), (u for u in parsed if isinstance(u, Unusable))
    )
    if claims.refused:
        # a stale answer needs nothing more: whoever holds the lease now meets the row
        await refuse(driver, runner=runner, unusable=claims.refused)
    return claims


async def refuse(driver: Driver, *, runner: RunnerId, unusable: Sequence[Unusable]) -> None:
    """End jobs this runner holds and cannot use `refused`, each saying why."""
    await complete_many(
        driver,
        runner=runner,
        outcomes=[
            OutcomeReport(
                job_id=u.job_id,
                lease_version=u.lease_version,
                outcome=Outcome.REFUSED,
                reason=u.reason,
            )
            for u in unusable
        ],
    )


async def claim(
    driver: Driver, *, runner: RunnerId, lane: str, limit: int, claim_id: uuid.UUID | None = None
) -> Claims:
    """Claim up to `limit` jobs of `lane` that this runner can run now (may be fewer, or
    none even when the queue is not empty: locked rows are skipped). A retry with the
    same claim id returns what it took, and refuses its unusable jobs again (`already`)."""
    if limit < 1:
        raise InvalidInput("claim limit must be at least 1")
    rows = await driver.fetch(
        queries.sql("lease_claim"), runner, lane, limit, claim_id or uuid.uuid4()
    )
    return await _usable(driver, runner, rows)


async def announce_lane(driver: Driver, lane: str) -> None:
    """Wake every runner of `lane`, so one with room looks for its queued jobs."""
    await driver.fetch(queries.sql("lease_announce_lane"), lane)


async def heartbeat(
    driver: Driver, *, runner: RunnerId, leases: Sequence[tuple[JobId, FencingToken]]
) -> list[HeartbeatResult]:
    """Extend the leases this runner holds (and mark it alive); stale ones are reported,
    not raised, so one lost job does not hide the others' renewals."""
    _no_duplicates([job for job, _ in leases])
    rows = await driver.fetch(
        queries.sql("lease_heartbeat"),
        runner,
        [job for job, _ in leases],
        [token for _, token in leases],
    )
    return [HeartbeatResult.model_validate(row) for row in rows]


async def report_start(driver: Driver, *, runner: RunnerId, start: StartReport) -> WriteStatus:
    """claimed -> running; raises `StaleLease` if the lease moved on."""
    rows = await driver.fetch(
        queries.sql("lease_report_start"),
        runner,
        start.job_id,
        start.lease_version,
        start.node,
        start.run_id,
        start.pid,
        start.process_started_at,
        start.prepare_ms,
    )
    return check(rows[0]["status"], job_id=start.job_id, token=start.lease_version, write="start")


def _outcome_columns(outcomes: Sequence[OutcomeReport]) -> list[list[object]]:
    """The outcome arrays `fleetq.complete` and `fleetq.complete_and_claim` take ($2-$10)."""
    _no_duplicates([o.job_id for o in outcomes])
    return [
        [o.job_id for o in outcomes],
        [o.lease_version for o in outcomes],
        [o.outcome.value for o in outcomes],
        [o.exit_code for o in outcomes],
        [o.reason for o in outcomes],
        [o.log_tail for o in outcomes],
        [o.prepare_ms for o in outcomes],
        [o.run_ms for o in outcomes],
        [ago_ms(o.ended_monotonic) for o in outcomes],
    ]


def _provenance_column(outcomes: Sequence[OutcomeReport]) -> list[str | None]:
    """Each outcome's provenance as JSON text, the last array both functions take."""
    return [None if o.provenance is None else json.dumps(o.provenance) for o in outcomes]


async def complete_many(
    driver: Driver, *, runner: RunnerId, outcomes: Sequence[OutcomeReport]
) -> list[JobWrite]:
    """Record many outcomes in one round trip; the answer says which were stale."""
    rows = await driver.fetch(
        queries.sql("lease_complete"),
        runner,
        *_outcome_columns(outcomes),
        _provenance_column(outcomes),
    )
    return [JobWrite.model_validate(row) for row in rows]


async def complete_and_claim(
    driver: Driver,
    *,
    runner: RunnerId,
    outcomes: Sequence[OutcomeReport],
    lane: str,
    limit: int,
    claim_id: uuid.UUID,
) -> tuple[list[JobWrite], Claims]:
    """`complete_many`, then a claim of up to `limit` jobs of `lane` for the room those
    outcomes free, in one transaction (a retry with the same claim id returns what the
    first attempt took, and outcomes already written answer `already`). Unusable jobs
    it took are refused after it, as `claim` refuses them."""
    rows = await driver.fetch(
        queries.sql("lease_complete_and_claim"),
        runner,
        *_outcome_columns(outcomes),
        lane,
        limit,
        claim_id,
        _provenance_column(outcomes),
    )
    answers = [JobWrite.model_validate(r) for r in rows if r["kind"] == "outcome"]
    claims = await _usable(driver, runner, [r for r in rows if r["kind"] == "claim"])
    return answers, claims


async def complete(driver: Driver, *, runner: RunnerId, outcome: OutcomeReport) -> WriteStatus:
    """Record one outcome; raises `StaleLease` if the lease moved on."""
    (answer,) = await complete_many(driver, runner=runner, outcomes=[outcome])
    return check(answer.status, job_id=outcome.job_id, token=outcome.lease_version, write="outcome")


async def report_lost(
    driver: Driver, *, runner: RunnerId, job_id: JobId, token: FencingToken, reason: str
) -> str:
    """Report that a claim launched nothing or its run is gone: 'requeued' the first time,
    'failed' the second, 'already' on a retry; raises `StaleLease` if the lease moved on."""
    rows = await driver.fetch(queries.sql("lease_report_lost"), runner, job_id, token, reason)
    status = str(rows[0]["status"])
    if status == WriteStatus.STALE:
        raise StaleLease(job_id, token, "loss report")
    return status


async def confirm_stop(
    driver: Driver,
    *,
    runner: RunnerId,
    job_id: JobId,
    token: FencingToken,
    signal: int | None,
    reason: str,
    ended_monotonic: float | None = None,
) -> None:
    """Record that this runner's execution of (job, token) is gone; `ended_monotonic`
    is when it was seen gone (`time.monotonic()`), None when only now bounds it."""
    await driver.fetch(
        queries.sql("lease_confirm_stop"),
        runner,
        job_id,
        token,
        signal,
        reason,
        ago_ms(ended_monotonic),
    )


async def reap(driver: Driver, *, limit: int = 1000, now: datetime | None = None) -> ReapResult:
    """One reaper pass (does nothing unless this caller wins the leader lock)."""
    rows = await driver.fetch(queries.sql("lease_reap"), limit, now)
    return ReapResult.model_validate(rows[0])


async def next_retry_in(driver: Driver) -> float | None:
    """Seconds until the next retry falls due (None: none waits)."""
    rows = await driver.fetch(queries.sql("lease_next_retry_in"))
    seconds = rows[0]["seconds"]
    return None if seconds is None else float(seconds)


async def fenced_write(
    driver: Driver, *, key: str, job_id: JobId, token: FencingToken, value: dict[str, object]
) -> bool:
    """Write to the fenced ledger; False when a newer token was already seen for `key`."""
    rows = await driver.fetch(
        queries.sql("lease_fenced_write"), key, job_id, token, payload_json(value)
    )
    return bool(rows[0]["accepted"])


async def fenced_violations(driver: Driver) -> int:
    """Accepted ledger writes that went behind an earlier token (must be 0)."""
    rows = await driver.fetch(queries.sql("lease_fenced_violations"))
    return int(rows[0]["violations"])


async def fenced_duplicates(driver: Driver) -> int:
    """Jobs with ledger effects accepted under more than one token (see the query)."""
    rows = await driver.fetch(queries.sql("lease_fenced_duplicates"))
    return int(rows[0]["duplicates"])


def ago_ms(ended_monotonic: float | None) -> int | None:
    """Milliseconds since `ended_monotonic` (a `time.monotonic()` reading), read now, as
    the request that carries it is sent; None stays None (the end was not measured)."""
    if ended_monotonic is None:
        return None
    return max(0, round((time.monotonic() - ended_monotonic) * 1000))


def _no_duplicates(job_ids: Sequence[int]) -> None:
    if len(set(job_ids)) != len(job_ids):
        raise InvalidInput("a batch names the same job twice")


async def release(
    driver: Driver,
    *,
    runner: RunnerId,
    job_id: JobId,
    token: FencingToken,
    reason: str,
    fenced: bool = False,
    ended_monotonic: float | None = None,
) -> str:
    """Hand a lease back (graceful shutdown): requeued at once, not counted as lost.
    After a self-fence (`fenced`) it counts a reassignment like an expiry, so a job
    cannot cycle through self-fences without end: 'failed' past `reassignment_cap`.
    Raises `StaleLease` if the lease moved on."""
    rows = await driver.fetch(
        queries.sql("lease_release"),
        runner,
        job_id,
        token,
        reason,
        fenced,
        ago_ms(ended_monotonic),
    )
    status = str(rows[0]["status"])
    if status == WriteStatus.STALE:
        raise StaleLease(job_id, token, "release")
    return status
