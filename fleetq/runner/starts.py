"""A command run's start report: the run on record (its execution, node, pid and run
id; the job `running`), sent as its process starts and, when that fails for a transient
reason, again in the background while the run goes on (`StartResend`)."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from fleetq.core import leasing
from fleetq.core.driver import Driver
from fleetq.core.errors import FleetqError, StaleLease
from fleetq.core.models import StartReport
from fleetq.runner import gate, metrics, orphans
from fleetq.runner.execution import Execution, StartResend, Toolkit
from fleetq.runner.loops import Backoff, transient, wait_any

log = logging.getLogger("fleetq.runner.execution")


async def report_start(
    ex: Execution, kit: Toolkit, pid: int, at: Any, prepare_ms: int, opened: gate.Gate | None
) -> None:
    """A command's process has started (`pid`, at `at`): journal it, then report it,
    through the launch gate's transaction when one is open."""
    ex.pid = pid
    kit.journal.launched(
        ex.claim.job_id, ex.claim.lease_version, pid, at.timestamp(), orphans.birth(pid)
    )
    if os.environ.get("FLEETQ_TEST_HOLD_START_REPORT"):
        if opened is not None:
            await opened.close(commit=False)
        return  # test hook: the start report "never reaches" the database
    start = StartReport(
        job_id=ex.claim.job_id,
        lease_version=ex.claim.lease_version,
        node=kit.node,
        run_id=ex.run_id,
        pid=pid,
        process_started_at=at,
        prepare_ms=prepare_ms,
    )
    try:
        if opened is None:
            await _send_start(ex, kit, start, ended=None)
        else:  # in the gate's transaction, which holds the job's row until it commits
            try:
                await _send_start(ex, kit, start, ended=None, driver=opened.driver)
            finally:
                await opened.close(commit=True)
    except FleetqError as exc:
        # The lease is still ours until it expires, and the heartbeat will tell; the run
        # stays supervised. A transient failure is sent again until it lands; a restarted
        # runner adopts a run whose start report was lost (collection).
        if not transient(exc):
            log.warning("start report of job=%d refused: %s", ex.claim.job_id, exc)
            return
        log.warning("start report failed job=%d: %s; sending it again", ex.claim.job_id, exc)
        ended = asyncio.Event()
        ex.start_resend = StartResend(
            start, asyncio.create_task(_resend_start(ex, kit, start, ended)), ended
        )


async def _send_start(
    ex: Execution,
    kit: Toolkit,
    start: StartReport,
    *,
    ended: asyncio.Event | None,
    driver: Driver | None = None,
) -> None:
    """One start report. A stale lease stops a run that still runs (another holder has
    the job); a run that has ended by the answer (`ended` set) has nothing to stop, and
    its end's own write meets the same fence."""
    try:
        await leasing.report_start(driver or kit.driver, runner=kit.runner, start=start)
    except StaleLease:
        metrics.STALE.labels("start", "zombie").inc()
        if ended is not None and ended.is_set():
            log.info(
                "start of job=%d token=%d not recorded: the lease moved on before its run ended",
                start.job_id,
                start.lease_version,
            )
        else:
            ex.request_stop("stale")
        return
    metrics.STARTS.inc()
    if ex.trace is not None and start.pid is not None:
        ex.trace.event("started", pid=start.pid)
    log.info("started job=%d token=%d pid=%s", start.job_id, start.lease_version, start.pid)


async def _resend_start(
    ex: Execution, kit: Toolkit, start: StartReport, ended: asyncio.Event
) -> None:
    """Send a failed start report again, with backoff, until it lands, the lease turns
    out stale, the database refuses it for good, the run is stopped, or the runner must
    stop at once (a graceful shutdown lets runs end and writes their outcomes, so their
    starts too). When the run ends it is tried at once, and its end's write waits for
    it: that write needs what the start needs (the database, `executions`), so waiting
    costs it nothing, and a start sent after the outcome would be stale. Nothing here
    holds the job's row while it waits (report_start takes its tables first), so
    renewals go on."""
    backoff = Backoff()
    tried_after_end = False
    while True:
        if not ended.is_set():
            await wait_any((ended, ex.stop, kit.leaving), backoff.next())
        elif tried_after_end:
            await wait_any((ex.stop, kit.leaving), backoff.next())
        if ex.stop.is_set() or kit.leaving.is_set():
            why = ex.stop_reason if ex.stop.is_set() else "the runner stops at once"
            log.info("start of job=%d not recorded: %s", start.job_id, why)
            return
        tried_after_end = tried_after_end or ended.is_set()
        try:
            await _send_start(ex, kit, start, ended=ended)
            return
        except FleetqError as exc:
            if not transient(exc):
                log.warning("start of job=%d not recorded: %s", start.job_id, exc)
                return
            log.warning("start report failed again job=%d: %s", start.job_id, exc)
