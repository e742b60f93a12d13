"""A run adopted after a restart (`--orphans adopt`): launched by this runner before it
restarted, wrapped so that it outlived it, and followed now to its outcome. Its process
is not this runner's child: its end is seen through a pidfd, its exit status read from
the wrapper's file (`fleetq.runner.wrap`)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

from fleetq.core.models import Outcome
from fleetq.runner import executor, orphans
from fleetq.runner.execution import Execution, Toolkit, run_name
from fleetq.runner.outcomes import record


def ran_for(pid: int, started_at: float) -> float:
    """How long an adopted run has run: from its process's start on the boot's clock, so
    a step of the wall clock since its launch (an NTP correction) neither kills it early
    as timed out nor lets it run over; by the wall clock only when the process is gone."""
    age = orphans.age(pid)
    return age if age is not None else time.time() - started_at


async def carry_on(ex: Execution, kit: Toolkit, *, started_at: float) -> None:
    """Follow an adopted run (launched by this runner before a restart) to its outcome."""
    claim = ex.claim
    assert ex.pid is not None
    name = run_name(claim.job_id, claim.lease_version, ex.run_id)
    remaining = claim.timeout_s - ran_for(ex.pid, started_at)
    finished = await watch_adopted(
        ex.pid,
        status_file=kit.logs / f"{name}.status",
        log_path=kit.logs / f"{name}.log",
        timeout_s=remaining,
        stop=ex.stop,
        stop_grace_s=lambda: ex.stop_grace_s,
    )
    await record(ex, kit, finished)
    if finished.outcome is not None:
        kit.journal.ended(claim.job_id, claim.lease_version)


async def watch_adopted(
    pid: int,
    *,
    status_file: Path,
    log_path: Path,
    timeout_s: float,
    stop: asyncio.Event,
    stop_grace_s: Callable[[], float] = lambda: executor.STOP_GRACE_S,
) -> executor.Finished:
    """Follow a job process this runner did not start (adopted after a restart) to its
    end, its timeout or a stop request; its exit status comes from the wrapper's file."""
    started = time.monotonic()
    gone = asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return executor.Finished(
            Outcome.FAILED, reason="adopted process vanished", log_tail=executor.read_tail(log_path)
        )
    loop.add_reader(fd, gone.set)  # a pidfd turns readable when the process exits
    waiter, stopper = asyncio.ensure_future(gone.wait()), asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait(
            {waiter, stopper}, timeout=max(0.0, timeout_s), return_when=asyncio.FIRST_COMPLETED
        )
        if waiter not in done:
            await executor.terminate_group(pid, grace_s=stop_grace_s())
            await gone.wait()
    finally:
        stopper.cancel()
        loop.remove_reader(fd)
        os.close(fd)
    run_ms = executor.ms_since(started)
    if waiter not in done:
        reason = "stopped" if stopper in done else "timeout"
        outcome = None if stopper in done else Outcome.FAILED
        return executor.Finished(
            outcome, reason=reason, log_tail=executor.read_tail(log_path), run_ms=run_ms
        )
    try:
        code = int(status_file.read_text().strip())  # noqa: ASYNC240 - a few bytes, local
    except (OSError, ValueError):
        return executor.Finished(
            Outcome.FAILED,
            reason="exit status lost",
            log_tail=executor.read_tail(log_path),
            run_ms=run_ms,
        )
    return executor.exited(code, executor.read_tail(log_path), run_ms)
