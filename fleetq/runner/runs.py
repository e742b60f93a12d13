"""The runner's executions: launched from claims or adopted after a restart, followed to
their end, and their stops recorded. Only `Runs` adds or removes them; the other parts
read the same map (claims are sized by it, leases renewed for it)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fleetq.core import leasing, queries
from fleetq.core.errors import FleetqError
from fleetq.core.models import (
    Claim,
    FencingToken,
    JobId,
    Outcome,
    OutcomeReport,
    StartReport,
    Unusable,
)
from fleetq.runner import executor, loops, orphans
from fleetq.runner.adoption import carry_on
from fleetq.runner.carrying import carry_out
from fleetq.runner.execution import Execution, Toolkit
from fleetq.runner.journal import Entry
from fleetq.runner.outcomes import hand_back

log = logging.getLogger("fleetq.runner.service")


@dataclass(frozen=True)
class RunHooks:
    """What the executions ask of the rest of the runner."""

    renew_sooner: Callable[[Iterable[Execution]], None]  # new leases: maybe renew sooner
    confirm: Callable[[Execution, str], Awaitable[None]]  # record a stop this runner made
    drain_self: Callable[[str], Awaitable[None]]  # a stop that could not be made
    ended: Callable[[Execution], None]  # a run ended: its room is free


class Runs:
    """Every execution of this runner, each a task, and runs superseded by its own newer
    claim of their job until they end."""

    def __init__(
        self,
        *,
        kit: Toolkit,
        executions: dict[JobId, Execution],
        stop: asyncio.Event,
        hooks: RunHooks,
    ) -> None:
        self.kit, self.executions, self.stop, self.hooks = kit, executions, stop, hooks
        self.tasks: dict[JobId, asyncio.Task[None]] = {}
        # runs of this runner stopping because it claimed their job again: task -> (job, token)
        self.superseded: dict[asyncio.Task[None], tuple[JobId, FencingToken]] = {}

    def launch(self, claim: Claim, lane: str, sent: float) -> None:
        ex = Execution(claim=claim, lane=lane, renewed_at=sent, lease_s=claim.lease_left_s)
        if (older := self.executions.get(claim.job_id)) is not None:
            # This runner claimed again a job it still runs under an older token (it was
            # frozen past its lease, e.g. SIGSTOP, and the job came back to the queue):
            # that run is superseded by our own newer claim. It stops and confirms as any
            # superseded run; the newer one takes its place here.
            older.request_stop("superseded")
            if (task := self.tasks.get(claim.job_id)) is not None:
                self.superseded[task] = (older.claim.job_id, older.claim.lease_version)
        self.executions[claim.job_id] = ex
        log.debug("claimed job=%d token=%d lane=%s", claim.job_id, claim.lease_version, lane)
        # unnamed: naming a task per job was 4% of a runner's busy CPU under a backlog;
        # SIGUSR1's dump names job tasks from self.tasks (task_labels)
        task = asyncio.create_task(self._execute(ex))
        self.tasks[claim.job_id] = task
        task.add_done_callback(functools.partial(self._finished, ex))

    def task_labels(self) -> dict[asyncio.Task[Any], str]:
        """Each job's task, named by its job (for SIGUSR1's dump: job tasks are unnamed),
        a superseded run's by its job and token."""
        labels = {task: f"job:{job_id}" for job_id, task in self.tasks.items()}
        for task, (job_id, token) in self.superseded.items():
            labels[task] = f"job:{job_id} token {token} (superseded)"
        return labels

    def _finished(self, ex: Execution, task: asyncio.Task[None]) -> None:
        job_id = ex.claim.job_id
        self.superseded.pop(task, None)
        if self.tasks.get(job_id) is task:  # not a newer execution of the same job
            self.executions.pop(job_id, None)
            self.tasks.pop(job_id, None)
        self.hooks.ended(ex)

    async def _execute(self, ex: Execution) -> None:
        try:
            await carry_out(ex, self.kit)
        except Exception as exc:
            await self._runner_error(ex, exc)
        await self._after_stop(ex)

    async def _runner_error(self, ex: Execution, exc: Exception) -> None:
        """An execution ended by fleetq itself, not by its job: kill whatever it launched
        and record an outcome that says why, so the job neither runs unwatched nor holds
        a slot until its lease runs out."""
        c = ex.claim
        if ex.pid is not None:
            await executor.terminate_group(ex.pid, grace_s=executor.STOP_GRACE_S)
        if ex.ended_monotonic is None:  # a process seen to end keeps that end, not this
            ex.ended_monotonic = time.monotonic()
        if ex.recorded or ex.stop_reason is not None:
            return
        error = loops.environmental(exc)
        if error is not None and loops.transient(error):
            # the database went away under one of the execution's own calls (reading its
            # operation, reporting): not the job's failure, and not a bug
            await hand_back(ex, self.kit, f"database connection lost: {error}")
            return
        log.error("execution of job=%d failed inside the runner", c.job_id, exc_info=exc)
        report = OutcomeReport(
            job_id=c.job_id,
            lease_version=c.lease_version,
            outcome=Outcome.FAILED,
            reason=f"runner error: {type(exc).__name__}: {exc}"[:500],
            log_tail="".join(traceback.format_exception(exc))[-executor.TAIL_BYTES :],
            ended_monotonic=ex.ended_monotonic,
        )
        with contextlib.suppress(FleetqError):
            await self.kit.reporter.record(report)

    async def _after_stop(self, ex: Execution) -> None:
        """Record a stop this runner made (cancel, lease lost, self-fenced)."""
        if ex.stop_unconfirmed:
            reason = f"stop-unconfirmed: job {ex.claim.job_id}"
            log.error("%s: its process group survived SIGKILL; draining this runner", reason)
            await loops.persist(reason, lambda: self.hooks.drain_self(reason), self.stop)
            return  # not confirmed, so the job keeps showing "stop pending"
        if ex.stop_reason in ("cancelled", "superseded", "stale", "self_fenced"):
            reason = "superseded" if ex.stop_reason == "stale" else ex.stop_reason
            await loops.persist(
                f"stop of job={ex.claim.job_id}",
                lambda: self.hooks.confirm(ex, reason),
                self.stop,
            )
        if ex.stop_reason is not None:
            self.kit.journal.ended(ex.claim.job_id, ex.claim.lease_version)

    async def adopt(self, entry: Entry) -> None:
        """Take over a run launched before a restart: report its start if that was lost,
        then follow it to its outcome like any other execution."""
        sent = time.monotonic()  # its lease's clock, as a renewal's
        rows = await self.kit.driver.fetch(queries.sql("lease_job"), self.kit.runner, entry.job_id)
        if not rows:
            # its lease ended between the collection pass and now: the run may not go on
            await asyncio.to_thread(orphans.kill_run, entry.run_id)
            self.kit.journal.ended(entry.job_id, entry.token)
            log.warning("not adopting job=%d: its lease moved on; run killed", entry.job_id)
            return
        (row,) = rows
        claim = leasing.parse_claim({**row, "job_id": row["id"]})
        if isinstance(claim, Unusable):
            # a row no claim can use (its run began before the row went bad, or under a
            # version that read it otherwise): the run may not go on, and the job ends
            await asyncio.to_thread(orphans.kill_run, entry.run_id)
            await leasing.refuse(self.kit.driver, runner=self.kit.runner, unusable=[claim])
            self.kit.journal.ended(entry.job_id, entry.token)
            log.warning("refused job=%d token=%d: %s", claim.job_id, entry.token, claim.reason)
            return
        ex = Execution(
            claim=claim,
            lane=row["lane"],
            known_run_id=uuid.UUID(entry.run_id),
            pid=entry.pid,
            renewed_at=sent,
            lease_s=claim.lease_left_s,
        )
        assert entry.pid is not None and entry.started_at is not None
        if row["state"] == "claimed":
            await leasing.report_start(
                self.kit.driver,
                runner=self.kit.runner,
                start=StartReport(
                    job_id=claim.job_id,
                    lease_version=claim.lease_version,
                    node=self.kit.node,
                    run_id=ex.run_id,
                    pid=entry.pid,
                    process_started_at=datetime.fromtimestamp(entry.started_at, UTC),
                ),
            )
        log.warning(
            "adopted job=%d token=%d pid=%d run=%s",
            claim.job_id,
            claim.lease_version,
            entry.pid,
            entry.run_id,
        )
        self.executions[claim.job_id] = ex
        self.hooks.renew_sooner([ex])
        task = asyncio.create_task(self._follow(ex, entry.started_at), name=f"job:{claim.job_id}")
        self.tasks[claim.job_id] = task
        task.add_done_callback(functools.partial(self._finished, ex))

    async def _follow(self, ex: Execution, started_at: float) -> None:
        try:
            await carry_on(ex, self.kit, started_at=started_at)
        except Exception as exc:
            await self._runner_error(ex, exc)
        await self._after_stop(ex)
