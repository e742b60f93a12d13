"""The collection pass: on start-up, settle everything the database says this runner
holds, since a restarted runner runs nothing.

A runner's job processes die with it (parent-death signal), so after a restart:
- a live lease it holds launched nothing that still runs: whatever the journal says was
  launched is swept by run id, and the claim is reported lost (requeued the first time,
  failed the second; DESIGN §1.5);
- a cancelled job still reserved on it: the stop is confirmed (nothing runs);
- an execution of its own with no recorded end whose lease moved on meanwhile: swept by
  run id and confirmed stopped as superseded, which closes its overlap window.

Adopting a still-running process (rather than reporting it lost) needs processes that
outlive their runner, which the parent-death signal rules out; see docs/recovery.md.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from fleetq.core import leasing, queries
from fleetq.core.driver import Driver
from fleetq.core.errors import StaleLease
from fleetq.core.models import FencingToken, JobId, RunnerId
from fleetq.runner import orphans
from fleetq.runner.journal import Journal

log = logging.getLogger(__name__)


@dataclass
class Collected:
    """What one collection pass did."""

    lost: int = 0
    stops_confirmed: int = 0
    superseded_closed: int = 0


async def collect(driver: Driver, runner: RunnerId, journal: Journal) -> Collected:
    """Settle what this runner holds after a restart; returns counts."""
    done = Collected()
    entries = journal.open_entries()
    for row in await driver.fetch(queries.sql("lease_held_by"), runner):
        job, token = JobId(row["job_id"]), FencingToken(row["lease_version"])
        entry = entries.get((job, token))
        if entry is not None:
            await asyncio.to_thread(orphans.kill_run, entry.run_id)
        if row["state"] == "cancelled":
            await leasing.confirm_stop(
                driver, runner=runner, job_id=job, token=token, signal=None, reason="cancelled"
            )
            done.stops_confirmed += 1
            continue
        reason = (
            "runner restarted; launched nothing"
            if entry is None
            else f"runner restarted; run {entry.run_id} did not survive it"
        )
        try:
            status = await leasing.report_lost(
                driver, runner=runner, job_id=job, token=token, reason=reason
            )
        except StaleLease:
            continue  # moved on between the read and the report
        log.warning("collected job=%d token=%d: %s -> %s", job, token, reason, status)
        done.lost += 1
    for row in await driver.fetch(queries.sql("lease_open_executions"), runner):
        await asyncio.to_thread(orphans.kill_run, str(row["run_id"]))
        await leasing.confirm_stop(
            driver,
            runner=runner,
            job_id=JobId(row["job_id"]),
            token=FencingToken(row["lease_version"]),
            signal=None,
            reason="superseded",
        )
        done.superseded_closed += 1
    for job_id, version in entries:
        journal.ended(job_id, version)
    journal.compact()
    return done
