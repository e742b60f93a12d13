"""How an execution ends on record: its outcome handed to the reporter, or, for a run cut
off by a lost connection, its lease handed back (counted against the reassignment cap);
a stopped run writes nothing (its stop is confirmed by the runner)."""

from __future__ import annotations

import contextlib
import logging

from fleetq.core import leasing
from fleetq.core.driver import Driver
from fleetq.core.errors import StaleLease
from fleetq.core.models import Claim, Outcome, OutcomeReport, RunnerId
from fleetq.runner import executor
from fleetq.runner.execution import Execution, Toolkit
from fleetq.runner.loops import environmental, persist
from fleetq.runner.reporter import OutcomeNotRecorded

log = logging.getLogger("fleetq.runner.execution")


async def _retry_soon(kit: Toolkit) -> None:
    """A failed attempt may be retried after its backoff: a reaper pass then queues it,
    not the next pass of the reap interval. A question that fails changes nothing."""
    try:
        due = await leasing.next_retry_in(kit.driver)
    except Exception as exc:
        if environmental(exc) is None:
            raise
        return
    if due is not None:
        kit.retry_soon(due)


async def record(
    ex: Execution, kit: Toolkit, finished: executor.Finished, prepare_ms: int | None = None
) -> None:
    """Write what a run came to: its outcome, its hand-back when it was cut off, or
    nothing when it was stopped; its start report, if still being sent, lands first."""
    c = ex.claim
    ex.signal = finished.signal
    ex.ended_monotonic = finished.ended_monotonic  # from now on the self-fence leaves it
    ex.end_dated = finished.end_dated
    if finished.reason == "stop-unconfirmed":
        ex.stop_unconfirmed = True
    if (resend := ex.start_resend) is not None:
        # the run on record before its end is written (the self-fence leaves an ended
        # run alone meanwhile)
        resend.ended.set()
        await resend.task
    if finished.lost is not None:
        await hand_back(ex, kit, finished.lost)
        return
    if finished.outcome is None:
        log.info("stopped job=%d token=%d reason=%s", c.job_id, c.lease_version, ex.stop_reason)
        return
    report = OutcomeReport(
        job_id=c.job_id,
        lease_version=c.lease_version,
        outcome=finished.outcome,
        exit_code=finished.exit_code,
        reason=finished.reason,
        log_tail=finished.log_tail,
        prepare_ms=prepare_ms,
        run_ms=finished.run_ms,
        ended_monotonic=ex.end_seen,
        provenance=ex.provenance,
    )
    try:
        status = await kit.reporter.record(report)
        if finished.outcome == Outcome.FAILED:
            await _retry_soon(kit)
    except OutcomeNotRecorded as exc:
        log.error(
            "%s job=%d token=%d not recorded (%s); it runs again after its lease",
            finished.outcome,
            c.job_id,
            c.lease_version,
            exc,
        )
        return
    ex.recorded = True
    if ex.trace is not None:
        ex.trace.ended(finished.outcome, finished.exit_code, finished.reason)
    # handler jobs can run thousands a second: their success lines are debug (-v)
    level = logging.DEBUG if finished.exit_code == 0 and ex.pid is None else logging.INFO
    log.log(
        level,
        "%s job=%d token=%d exit=%s write=%s",
        finished.outcome,
        c.job_id,
        c.lease_version,
        finished.exit_code,
        status,
    )


async def hand_back(ex: Execution, kit: Toolkit, reason: str) -> None:
    """A run cut off by a transient failure (its database connection was lost): handed
    back at once, counted against the reassignment cap like an expiry, so a flaky
    network retries the job a few times rather than failing it, and never without end.
    A stale answer means the job had moved on (an outcome that did commit stands)."""
    c = ex.claim
    log.warning("job=%d token=%d cut off: %s", c.job_id, c.lease_version, reason)

    async def write() -> None:
        await release_counted(kit.driver, kit.runner, c, reason, ended_monotonic=ex.end_seen)
        ex.recorded = True

    await persist(f"hand-back of job={c.job_id}", write, kit.stopping)


async def release_counted(
    driver: Driver,
    runner: RunnerId,
    claim: Claim,
    reason: str,
    *,
    ended_monotonic: float | None = None,
) -> None:
    """Hand a lease back now, counted as a reassignment (so no job cycles for ever); a
    stale answer means the lease had moved on already, which is as good."""
    with contextlib.suppress(StaleLease):
        status = await leasing.release(
            driver,
            runner=runner,
            job_id=claim.job_id,
            token=claim.lease_version,
            reason=reason,
            fenced=True,
            ended_monotonic=ended_monotonic,
        )
        log.info("job=%d token=%d handed back: %s", claim.job_id, claim.lease_version, status)
