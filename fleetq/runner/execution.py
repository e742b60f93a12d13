"""A claimed job on this runner, and what carrying it out needs from the runner.

An `Execution` owns the local facts about a claimed job (its lease, its stop request,
its staged tree) so the heartbeat and the control listener can stop it, and the
claimer can count free slots. What is done with it lives beside: `carrying` (a job to
its outcome), `starts` (its start report), `outcomes` (its end's write), `handling` (a
handler job) and `adoption` (a run adopted after a restart).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from fleetq.core.driver import Driver
from fleetq.core.models import Claim, RunnerId, StartReport
from fleetq.runner import executor, provenance, tracing
from fleetq.runner.context import JobContext
from fleetq.runner.jobuser import JobUsers
from fleetq.runner.journal import Journal
from fleetq.runner.reporter import Reporter
from fleetq.runner.staging import Staging


@dataclass
class Operation:
    """What an operation runs (from the database)."""

    command: str | None
    handler: str | None
    timeout_s: int
    repository: str
    limits: executor.Limits = field(default_factory=lambda: executor.Limits())
    evidence: provenance.Evidence = field(default_factory=lambda: provenance.Evidence())

    def definition(self) -> dict[str, Any]:
        """The operation as run, for the verdict's provenance."""
        return provenance.definition(
            command=self.command,
            handler=self.handler,
            timeout_s=self.timeout_s,
            limits=self.limits.as_row(),
            evidence=self.evidence,
        )


@dataclass
class Execution:
    """A claimed job on this runner."""

    claim: Claim
    lane: str
    # the run's id, when it is already known (an adopted run's, from the journal); else
    # `run_id` makes one when first asked, which only a command's launch does (a
    # handler's execution gets an id of the database's, at its lease's end): a uuid4 per job
    # was a measurable share of a runner's CPU under a backlog
    known_run_id: uuid.UUID | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    stop_reason: str | None = None
    pid: int | None = None
    # monotonic time at which the lease was last known renewed (sent before the renewal,
    # so it errs early): self-fencing counts from here, never from the runner's wall clock
    renewed_at: float = field(default_factory=time.monotonic)
    # how long the lease was good for from `renewed_at`, as the database answered the
    # claim or renewal sent then (None: not answered; the runner's lease setting stands):
    # renewal and self-fence follow each lease's own length, whatever the settings say now
    lease_s: float | None = None

    hook: Callable[[], None] | None = None
    stop_unconfirmed: bool = False  # a stop was asked, but the process group survived it
    signal: int | None = None  # the signal that ended the process, recorded with a stop
    recorded: bool = False  # its outcome (or loss) is in the database
    stop_grace_s: float = executor.STOP_GRACE_S  # SIGTERM to SIGKILL when stopped
    start_resend: StartResend | None = None  # its start report, failed once, sent again
    ctx: JobContext | None = None  # a handler's context, while it runs
    trace: tracing.JobTrace | None = None  # its spans (no-ops unless tracing is on)
    # when its run was seen gone (`time.monotonic()`; see executor.Finished): the writes
    # that end it send it, so the database dates the end on its own clock
    ended_monotonic: float | None = None
    end_dated: bool = True  # False: seen gone only after the runner stalled (`stalls`)
    # what its verdict rests on besides the commit, gathered as it goes (`provenance`)
    provenance: dict[str, Any] | None = None

    @property
    def end_seen(self) -> float | None:
        """When its run was seen gone, for the writes that end it: None when not seen, or
        seen only after a stall (then the database bounds the end by the write)."""
        return self.ended_monotonic if self.end_dated else None

    @property
    def run_id(self) -> uuid.UUID:
        """This run's id: the one it was adopted with, else one made now, once."""
        if self.known_run_id is None:
            self.known_run_id = uuid.uuid4()
        return self.known_run_id

    @property
    def traceparent(self) -> str | None:
        """The trace context to hand the job: its run span's when spans are on, else the
        one it was submitted with."""
        return self.trace.header() if self.trace else self.claim.traceparent

    def renewed(self, sent: float, left: float | None) -> None:
        """Its lease was renewed by a call sent at `sent` (`time.monotonic()`), with
        `left` seconds to run as the database answered."""
        self.renewed_at = sent
        if left is not None:
            self.lease_s = left

    @property
    def in_transaction(self) -> bool:
        """Whether its handler holds a `ctx.transaction()` (and so its job's row) now."""
        return self.ctx is not None and self.ctx.transactions_open > 0

    def request_stop(self, reason: str, *, grace_s: float | None = None) -> None:
        """Ask the execution to stop (it no longer holds its lease, or we shut down);
        `grace_s` shortens the time a command gets between SIGTERM and SIGKILL."""
        if grace_s is not None:
            self.stop_grace_s = min(self.stop_grace_s, grace_s)
        if self.stop_reason is None:
            self.stop_reason = reason
        self.stop.set()
        if self.hook is not None:
            self.hook()

    def on_stop(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call `hook` on a stop request (a running handler is cancelled this way)."""
        self.hook = hook
        return self._forget_hook

    def _forget_hook(self) -> None:
        self.hook = None


@dataclass
class StartResend:
    """A start report that failed once (a lost connection, a lock held past
    lock_timeout), sent again in the background while its run goes on.

    Why: a command's outcome records no execution (the start report writes it), so a run
    whose only start report failed was never on record: no execution with its node, pid
    and run id, the job never `running`, the run missing from the timeline and the
    overlap view."""

    report: StartReport
    task: asyncio.Task[None]
    ended: asyncio.Event  # set when the run's process is gone: an attempt at once


@dataclass
class Toolkit:
    """What executions need from the runner."""

    driver: Driver
    pool: asyncpg.Pool | None  # None: served through the API (no session to lend)
    runner: RunnerId
    node: str
    staging: Staging
    reporter: Reporter
    logs: Path
    keep_failed: bool
    operation: Callable[[str, str], Awaitable[Operation | None]]
    journal: Journal
    adopt: bool = False  # --orphans adopt: commands run wrapped and outlive the runner
    job_users: JobUsers | None = None  # --job-uid-range: commands run as these uids
    # a retry may fall due in this many seconds: run a reaper pass then (it queues it)
    retry_soon: Callable[[float], None] = lambda _seconds: None
    # set when the runner shuts down: writes that retry until they land give up then
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # set when it must stop at once (a second SIGTERM): writes that a graceful shutdown
    # still waits for (outcomes, a run's start) give up then
    leaving: asyncio.Event = field(default_factory=asyncio.Event)
    tools: provenance.Tools = field(default_factory=provenance.Tools)  # versions, asked once
    machine: dict[str, str] = field(default_factory=provenance.machine)

    async def environment(self, op: Operation, env: dict[str, str]) -> dict[str, Any]:
        """This runner as a verdict's provenance names it: id, node, machine, and the
        versions of the tools `op` declares (asked with the jobs' environment `env`)."""
        found: dict[str, Any] = {"runner": self.runner, "node": self.node, **self.machine}
        if op.evidence.provenance:
            found["tools"] = await self.tools.versions(op.evidence.provenance, env)
        return found


def run_name(job_id: int, token: int, run_id: uuid.UUID) -> str:
    """The file name stem of an execution's tree, log and status file."""
    return f"{job_id}-{token}-{run_id.hex[:8]}"
