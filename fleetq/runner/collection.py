"""The collection pass: on start-up, settle everything the database says this runner
holds, since a restarted runner runs nothing.

A runner's job processes die with it (parent-death signal), so after a restart:
- a live lease it holds launched nothing that still runs: whatever the journal says was
  launched is swept by run id, and the claim is reported lost (requeued the first time,
  failed the second; DESIGN §1.5);
- a cancelled job still reserved on it: the stop is confirmed (nothing runs);
- an execution of its own with no recorded end whose lease moved on meanwhile: swept by
  run id and confirmed stopped as superseded, which closes its overlap window.

With `--orphans adopt`, job processes outlive their runner instead, and a live lease
whose journal entry matches exactly one running process (pid, start time, run id) is
adopted: its start report is sent if it was lost, and it is followed to its outcome.
Anything ambiguous is refused with an `adoption_refused` event and left to lease
expiry.

All of this presumes that whoever held these leases is dead. The journal proves it for a
run it names (launched by a process of this directory, and this process holds the
directory's lock: `pidfile`), and so does the pid file naming an earlier process of
this runner here. Otherwise (a fresh directory; a runner of this id elsewhere whose
database session ended while it lives on) a lease is left alone, `left`: its holder
finishes or hands it back, or it expires and the reaper requeues it. A live process's
healthy run is never reported lost. See docs/recovery.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from dataclasses import dataclass, field

import psutil

from fleetq.core import leasing, queries
from fleetq.core.driver import Driver
from fleetq.core.errors import StaleLease
from fleetq.core.models import FencingToken, JobId, RunnerId
from fleetq.runner import orphans
from fleetq.runner.journal import Entry, Journal

log = logging.getLogger(__name__)


@dataclass
class Collected:
    """What one collection pass did; `adopted` are runs to follow to their outcome."""

    lost: int = 0
    stops_confirmed: int = 0
    superseded_closed: int = 0
    refused: int = 0
    adopted: list[Entry] = field(default_factory=list)
    # leases whose holder nothing proves dead: not this pass's to settle
    left: list[tuple[JobId, FencingToken]] = field(default_factory=list)


def identify(entry: Entry) -> tuple[str, dict[str, object]]:
    """Is the journal's launch still running, unambiguously? ("adopt" | "gone" |
    "refuse", evidence). Exactly one live process must match pid, start time and
    FLEETQ_RUN_ID and lead its process group; anything else that carries the run id
    makes the case ambiguous."""
    carriers = orphans.carrying(entry.run_id)
    evidence: dict[str, object] = {
        "run_id": entry.run_id,
        "journal_pid": entry.pid,
        "carriers": carriers,
    }
    if entry.pid is None or not psutil.pid_exists(entry.pid):
        return ("refuse" if carriers else "gone"), evidence
    if entry.birth is not None:
        birth = orphans.birth(entry.pid)
        if birth is None:
            return ("refuse" if carriers else "gone"), evidence
        evidence["birth"] = birth
        if birth != entry.birth:
            return "refuse", {**evidence, "why": "pid reused: another start"}
    else:  # journaled by a runner before births: the wall-clock start time, as it did
        try:
            started = psutil.Process(entry.pid).create_time()
        except psutil.Error:
            return ("refuse" if carriers else "gone"), evidence
        evidence["process_started_at"] = started
        if entry.started_at is None or abs(started - entry.started_at) > 0.05:
            return "refuse", {**evidence, "why": "pid reused: another start time"}
    leaders = [pid for pid in carriers if _leads_group(pid)]
    if leaders != [entry.pid]:
        return "refuse", {**evidence, "why": "journal and processes disagree", "leaders": leaders}
    return "adopt", evidence


async def _give_up(entry: Entry) -> list[int]:
    """Kill whatever still carries the entry's run id and remove its tree; the pids."""
    killed = await asyncio.to_thread(orphans.kill_run, entry.run_id)
    if entry.tree:
        await asyncio.to_thread(shutil.rmtree, entry.tree, True)
    return killed


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


async def collect(
    driver: Driver,
    runner: RunnerId,
    journal: Journal,
    *,
    adopt: bool = False,
    holder_gone: bool = True,
) -> Collected:
    """Settle what this runner holds after a restart; returns what it did. `holder_gone`:
    the process that held this runner's leases is known to be dead (an earlier process
    of this runner in this directory); without it only runs the journal names are."""
    done = Collected()
    entries = journal.open_entries()
    swept: set[tuple[int, int]] = set()  # entries whose run was killed already
    refused: set[tuple[int, int]] = set()  # entries whose adoption was refused
    for row in await driver.fetch(queries.sql("lease_held_by"), runner):
        job, token = JobId(row["job_id"]), FencingToken(row["lease_version"])
        entry = entries.get((job, token))
        if entry is None and not holder_gone:
            done.left.append((job, token))  # its holder may live: not reported, not swept
            continue
        if adopt and entry is not None and row["state"] != "cancelled":
            verdict, evidence = await asyncio.to_thread(identify, entry)
            if verdict == "adopt":
                done.adopted.append(entry)
                continue
            if verdict == "refuse":
                log.warning("adoption refused job=%d token=%d: %s", job, token, evidence)
                await driver.fetch(
                    queries.sql("lease_note_event"),
                    "adoption_refused",
                    job,
                    runner,
                    token,
                    json.dumps(evidence, default=str),
                )
                done.refused += 1
                refused.add((job, token))
                continue  # left to lease expiry: never guess which process is the job
        if entry is not None:
            await _give_up(entry)
            swept.add((job, token))
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
    adopted = {(e.job_id, e.token) for e in done.adopted}
    for row in await driver.fetch(queries.sql("lease_open_executions"), runner):
        key = (row["job_id"], row["lease_version"])
        if key in adopted or not (holder_gone or key in entries):
            continue  # a run of a holder that may live is its own to close
        if row["run_id"] is not None:  # a handler's run has none: no process of its own
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
    keep = {(e.job_id, e.token) for e in done.adopted}
    for (job_id, version), entry in entries.items():
        if (job_id, version) in keep:
            continue
        # A run this runner gives up must not run on unwatched. In adopt mode a run
        # whose lease expired while its runner was down still runs, next to the job's
        # newer execution and invisible to `fleetq overlaps`: kill it now.
        if (job_id, version) not in swept and await _give_up(entry):
            why = (
                "its adoption was refused"
                if (job_id, version) in refused
                else "its lease ended while this runner was down"
            )
            log.warning("killed run %s of job=%d token=%d: %s", entry.run_id, job_id, version, why)
        journal.ended(job_id, version)
    journal.compact()
    return done
