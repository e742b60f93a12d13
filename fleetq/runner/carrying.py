"""One job's journey on this runner: prepare, run, hand the outcome to the reporter.

A handler job runs in process (`handling`); a command job is staged, launched (as a job
uid of its own, when the runner has them) and followed here, its start reported as its
process starts (`starts`). Either way, what it came to is written by `outcomes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from fleetq.core.models import Outcome
from fleetq.runner import executor, gate, handover, provenance, steps, testreports, tracing
from fleetq.runner.execution import Execution, Operation, Toolkit, run_name
from fleetq.runner.handling import run_handler_job
from fleetq.runner.jobuser import JobUser
from fleetq.runner.outcomes import record
from fleetq.runner.output import Shipper
from fleetq.runner.staging import CommitMissing, StagingFailed
from fleetq.runner.starts import report_start

log = logging.getLogger("fleetq.runner.execution")

# how long a run's last output may take to ship before its outcome is written anyway
SHIP_FINAL_S = 5.0


async def carry_out(ex: Execution, kit: Toolkit) -> None:
    """Run one claimed job to its recorded outcome (or to a confirmed stop)."""
    with tracing.JobTrace(ex.claim, kit.runner) as trace:
        ex.trace = trace
        await _carry_out(ex, kit, trace)


async def _carry_out(ex: Execution, kit: Toolkit, trace: tracing.JobTrace) -> None:
    claim = ex.claim
    op = await kit.operation(claim.project, claim.operation)
    if op is None:
        await record(ex, kit, executor.Finished(Outcome.REFUSED, reason="operation not registered"))
        return
    ex.provenance = {
        "environment": await kit.environment(op, executor.job_environment({})),
        "definition": op.definition(),
    }
    if op.handler is not None:
        with trace.step("run"):
            finished = await run_handler_job(ex, kit, op)
        await record(ex, kit, finished)
        return
    await _carry_out_command(ex, kit, op, trace)


async def _carry_out_command(
    ex: Execution, kit: Toolkit, op: Operation, trace: tracing.JobTrace
) -> None:
    """A command job, under a uid of its own when the runner has job users: leased
    before its tree is staged, returned once nothing of it is left."""
    claim = ex.claim
    name = run_name(claim.job_id, claim.lease_version, ex.run_id)
    if kit.job_users is None:
        await _run_command(ex, kit, op, trace, name, None)
        return
    user = await kit.job_users.lease(ex.stop)
    if user is None:
        log.info(
            "not launching job=%d token=%d: stop requested while waiting for a job uid (%s)",
            claim.job_id,
            claim.lease_version,
            ex.stop_reason,
        )
        return
    try:
        await _run_command(ex, kit, op, trace, name, user)
    finally:
        # whatever ended the run (its end, a timeout, a stop, an error here): nothing of
        # it runs on under the uid the next job gets, nor can that job enter its tree
        await kit.job_users.give_back(user)
        await asyncio.to_thread(_reclaim, kit, kit.staging.trees / name)


async def _run_command(
    ex: Execution,
    kit: Toolkit,
    op: Operation,
    trace: tracing.JobTrace,
    name: str,
    user: JobUser | None,
) -> None:
    """Stage, launch (as `user` when given), follow and record one command job."""
    claim = ex.claim
    t0 = time.monotonic()
    facts = ex.provenance if ex.provenance is not None else {}
    staged: dict[str, str] = {}
    try:
        with trace.step("stage"):
            tree = await kit.staging.stage(
                repository=op.repository, commit=claim.commit_sha, name=name, facts=staged
            )
    except StagingFailed as exc:  # refused (no such commit) or the fleet's error
        facts |= {"failed_input": "staging", "staging": {"failed": str(exc)}}
        if isinstance(exc, CommitMissing):
            await record(ex, kit, executor.Finished(Outcome.REFUSED, reason=str(exc)))
            return
        failed = executor.Finished(Outcome.FAILED, reason=f"staging failed: {exc}")
        await record(ex, kit, failed)
        return
    facts["staging"] = staged
    if op.evidence.lockfiles:
        facts["lockfiles"] = await asyncio.to_thread(
            provenance.lockfiles, tree, op.evidence.lockfiles
        )
    command: str | list[str] = op.command or ""
    if (relative := op.evidence.steps_from) is not None:
        # the commit's own steps when it has the file (steps.py); the command when not
        planned = await asyncio.to_thread(
            steps.plan, tree, relative, cap_s=op.timeout_s, grace_s=executor.STOP_GRACE_S
        )
        facts["steps"] = {"file": relative, "absent": True} if planned is None else planned.facts
        if isinstance(planned, steps.Refused):
            facts["failed_input"] = "steps"
            facts["steps"]["refused"] = planned.reason
            why = f"steps refused: {planned.reason}"
            await record(ex, kit, executor.Finished(Outcome.FAILED, reason=why, log_tail=why))
            if not kit.keep_failed:
                kit.staging.discard(tree)
            return
        if planned is not None:
            command = planned.argv
    user_env: dict[str, str] = {}
    if user is not None:
        user_env = user.environment(await asyncio.to_thread(_give, kit, tree, user))
    prepare_ms = int((time.monotonic() - t0) * 1000)
    if ex.stop.is_set():
        # cancelled, superseded or self-fenced while its tree was being staged: nothing
        # may run now (the stop is confirmed by the runner as for a running job)
        log.info(
            "not launching job=%d token=%d: stop requested while staging (%s)",
            claim.job_id,
            claim.lease_version,
            ex.stop_reason,
        )
        kit.staging.discard(tree)
        return
    # through the API there is no session to hold the row across the spawn: ungated, the
    # start report's own fence stops a run the database no longer wants (gate.py)
    opened = await gate.enter(kit.pool, kit.runner, claim) if kit.pool is not None else None
    if isinstance(opened, str):
        # the database says no, though this runner has not heard why yet (a cancel whose
        # notification was lost): nothing runs, and the stop is confirmed as usual
        log.info("not launching job=%d token=%d: %s", claim.job_id, claim.lease_version, opened)
        ex.request_stop(opened)
        kit.staging.discard(tree)
        return
    try:
        launching = (tree, name, user, user_env, command)
        await _launch(ex, kit, op, trace, launching, prepare_ms, opened)
    finally:
        if opened is not None:
            await opened.close(commit=False)  # nothing launched: no start to commit


async def _launch(
    ex: Execution,
    kit: Toolkit,
    op: Operation,
    trace: tracing.JobTrace,
    staged: tuple[Path, str, JobUser | None, dict[str, str], str | list[str]],
    prepare_ms: int,
    opened: gate.Gate | None,
) -> None:
    """Launch a staged command (tree, run name, job user and its environment, the command
    or the commit's steps), follow it and record its outcome; its start report goes
    through the launch gate, when open."""
    claim = ex.claim
    tree, name, user, user_env, command = staged
    kit.journal.launching(claim.job_id, claim.lease_version, str(ex.run_id), str(tree))
    status_file = kit.logs / f"{name}.status" if kit.adopt else None
    log_path = kit.logs / f"{name}.log"
    ended = asyncio.Event()
    shipping = asyncio.create_task(Shipper(kit.driver, kit.runner, claim, log_path).run(ended))
    try:
        with trace.step("run"):
            finished = await executor.run_command(
                command,
                cwd=tree,
                # read inside the run's span: TRACEPARENT names it as the job's parent
                env=executor.job_environment(_job_env(ex, kit) | user_env),
                timeout_s=op.timeout_s,
                log_path=log_path,
                on_start=lambda pid, at: report_start(ex, kit, pid, at, prepare_ms, opened),
                stop=ex.stop,
                status_file=status_file,
                stop_grace_s=lambda: ex.stop_grace_s,
                user=user,
                limits=op.limits,
            )
        # Its process is over: dated now, not when the outcome is written after the output
        # below (up to SHIP_FINAL_S later, with the database out of reach): the self-fence
        # leaves an ended run alone, and an error meanwhile keeps this end, not its own time
        ex.ended_monotonic, ex.end_dated = finished.ended_monotonic, finished.end_dated
    finally:
        if opened is not None:
            # a launch that failed before its start report still holds the job's row:
            # the outcome below would wait on it (once closed, this is a no-op)
            await opened.close(commit=False)
        # what is left is shipped before the outcome (so `fleetq logs` ends with it),
        # but never holds the outcome up for long, nor stops it being written
        ended.set()
        if ex.start_resend is not None:  # at once, whatever ended the run
            ex.start_resend.ended.set()
        try:
            await asyncio.wait_for(shipping, SHIP_FINAL_S)
        except TimeoutError:
            log.warning("output of job=%d: the rest stays in %s", claim.job_id, log_path)
        except Exception as exc:  # its own bug or a cancelled write's: the outcome goes on
            log.warning("output of job=%d not shipped (%r); see %s", claim.job_id, exc, log_path)
    if ex.provenance is not None:
        if isinstance(command, list):
            finished = _steps_ended(ex.provenance, finished)
        if (finished.reason or "").startswith("launch failed"):
            ex.provenance.setdefault("failed_input", "command")  # a step's: named above
        if op.evidence.reports and finished.outcome is not None:
            ex.provenance["tests"] = await asyncio.to_thread(
                testreports.read, tree, op.evidence.reports
            )
    await record(ex, kit, finished, prepare_ms=prepare_ms)
    if finished.outcome is not None:
        kit.journal.ended(claim.job_id, claim.lease_version)
    if finished.outcome == Outcome.SUCCEEDED or not kit.keep_failed:
        kit.staging.discard(tree)


def _give(kit: Toolkit, tree: Path, user: JobUser) -> Path:
    """Hand a staged tree to its job's uid, with a fresh private home beside it (the
    job's HOME and TMPDIR); returns the home."""
    home = kit.staging.home_of(tree)
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(mode=0o700)
    handover.hand_over(home, user.uid, user.gid)
    handover.hand_over(tree, user.uid, user.gid)
    return home


def _reclaim(kit: Toolkit, tree: Path) -> None:
    """After its uid is returned: the job's home goes, and a tree kept (a failed run
    under --keep-failed, or one an error left) is the runner's again, closed."""
    shutil.rmtree(kit.staging.home_of(tree), ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        handover.take_back(tree)


def _job_env(ex: Execution, kit: Toolkit) -> dict[str, str]:
    c = ex.claim
    env = {
        "FLEETQ_JOB_ID": str(c.job_id),
        "FLEETQ_FENCING_TOKEN": str(c.lease_version),
        "FLEETQ_RUN_ID": str(ex.run_id),
        "FLEETQ_PROJECT": c.project,
        "FLEETQ_OPERATION": c.operation,
        "FLEETQ_COMMIT": c.commit_sha,
        "FLEETQ_NODE": kit.node,
    }
    if trace := ex.traceparent:  # the W3C name, which tracing libraries read to continue
        env["TRACEPARENT"] = trace
    return env


def _steps_ended(facts: dict[str, Any], finished: executor.Finished) -> executor.Finished:
    """What the last `fleetq-step` line says, in the provenance and the outcome: a step
    that could not start (no such program, no such directory) is a failed input, an
    error; one that timed out failed by its timeout, as the whole run's would."""
    how = steps.ended(finished.log_tail, exit_code=finished.exit_code, signal=finished.signal)
    if how is None or finished.outcome is None:
        return finished
    facts.setdefault("steps", {}).update(how)
    what = how["how"]
    if what.startswith("not run: "):
        facts["failed_input"] = "tool" if what.endswith(" not found") else "step"
        reason = f"launch failed: step {how['step']}: {what.removeprefix('not run: ')}"
        return replace(finished, reason=reason)
    if what.startswith("timed out"):
        return replace(finished, reason="timeout")
    return finished
