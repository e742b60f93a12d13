"""Run a command job's process and return what happened, as a value; never raise for the
job's failure (a handler job's is in `handling`, an adopted run's in `adoption`).

Commands run as argv (the operation's command split like a shell would, but no shell
runs) in their own session, so the whole process group can be signalled, with an
allow-listed environment: the runner's DSN and secrets never reach a job. Output goes to
a log file (not a pipe), whose tail goes into the outcome. A timeout or a stop request
sends SIGTERM to the group, then SIGKILL after a grace period, and waits until psutil
sees no process of the group left.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
import shlex
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import psutil
from pydantic import ConfigDict

from fleetq.core.config import LimitsConfig
from fleetq.core.models import Outcome
from fleetq.runner import orphans, stalls
from fleetq.runner.jobuser import JobUser
from fleetq.runner.private import open_private

TAIL_BYTES = 4096
STOP_GRACE_S = 5.0
STOP_DEADLINE_S = 30.0  # after SIGKILL: how long to wait for the group to be gone
ENV_ALLOW = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME")


@dataclass(frozen=True)
class Finished:
    """What an execution came to. `outcome` is None when it was stopped on request (the
    runner no longer holds the lease, or is shutting down): no outcome is written then."""

    outcome: Outcome | None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    log_tail: str = ""
    run_ms: int = 0
    # The run was cut off by the world, not by the job: a lost database connection. No
    # outcome is written; the run is reported lost (requeued once, then failed as lost).
    lost: str | None = None
    # When everything of the run was seen gone (`time.monotonic()`); None when that is not
    # known (a stop SIGKILL did not confirm). The database dates the end from it.
    ended_monotonic: float | None = field(default_factory=time.monotonic)
    # False: the runner noticed the end only after it stalled (`stalls`): the process may
    # have ended any time before, so the end is not dated from `ended_monotonic`
    end_dated: bool = True


OnStart = Callable[[int, datetime], Awaitable[None]]


class Limits(LimitsConfig):
    """An operation's resource limits (`limits` in the fleet file, read back from the
    database), applied with setrlimit to each process of a command job before it runs."""

    model_config = ConfigDict(frozen=True, extra="ignore")  # a newer schema's extra keys

    def rlimits(self) -> list[tuple[int, int, int]]:
        """(resource, soft, hard). CPU: SIGXCPU at the limit, SIGKILL a second later."""
        mib = 1024 * 1024
        found = []
        if self.memory_mb:
            found.append((resource.RLIMIT_AS, self.memory_mb * mib, self.memory_mb * mib))
        if self.cpu_seconds:
            found.append((resource.RLIMIT_CPU, self.cpu_seconds, self.cpu_seconds + 1))
        if self.open_files:
            found.append((resource.RLIMIT_NOFILE, self.open_files, self.open_files))
        if self.output_mb:
            found.append((resource.RLIMIT_FSIZE, self.output_mb * mib, self.output_mb * mib))
        return found

    def reason(self, sig: int | None) -> str | None:
        """The limit a signal stands for, if any (SIGXCPU, SIGXFSZ)."""
        if sig == signal.SIGXCPU and self.cpu_seconds:
            return f"cpu limit: more than {self.cpu_seconds}s of CPU (limits.cpu_seconds)"
        if sig == signal.SIGXFSZ and self.output_mb:
            return f"output limit: a file past {self.output_mb} MB (limits.output_mb)"
        return None


def _child_setup(parent: int | None, limits: Limits) -> Callable[[], None]:
    """What a job's process does between fork and exec: die with the runner (unless it
    is to outlive it), and take the operation's limits."""
    rlimits = limits.rlimits()

    def setup() -> None:
        if parent is not None:
            orphans.die_with_parent(parent)
        for which, soft, hard in rlimits:
            resource.setrlimit(which, (soft, hard))

    return setup


def job_environment(extra: dict[str, str]) -> dict[str, str]:
    """The allow-listed environment plus the job's FLEETQ_* variables."""
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOW}
    env.update(extra)
    return env


async def run_command(
    command: str | list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout_s: float,
    log_path: Path,
    on_start: OnStart,
    stop: asyncio.Event,
    status_file: Path | None = None,
    stop_grace_s: Callable[[], float] = lambda: STOP_GRACE_S,
    user: JobUser | None = None,
    limits: Limits | None = None,
) -> Finished:
    """Run a command (a string split into words like a shell would, or an argv) to its
    end, its timeout, or a stop request (as `user`, if given).

    With `status_file` (adopt mode) the command runs under `fleetq.runner.wrap`, which
    records its exit status there, and it is not tied to the runner's life: a restarted
    runner can adopt it.
    """
    if stop.is_set():  # asked to stop before it ever ran: launch nothing
        return Finished(None, reason="stopped before launch")
    try:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
    except ValueError as exc:  # applied before commands were checked at `fleetq apply`
        return _launch_failed(log_path, f"the command cannot be split into words ({exc})")
    if not argv:
        return _launch_failed(log_path, "the command names no program")
    if status_file is not None:
        argv = [sys.executable, "-m", "fleetq.runner.wrap", str(status_file), "--", *argv]
    # the loop's ticker: an end noticed after the runner stalled (SIGSTOP) is not dated
    with stalls.watching() as watch:
        started = time.monotonic()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # 0600: a job under another uid writes it through the descriptor it inherits, and
        # no other job may read it (issue 41)
        with open(open_private(log_path), "wb") as log:  # noqa: ASYNC230 - local, opened once
            try:
                parent = os.getpid()
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    preexec_fn=_child_setup(None if status_file else parent, limits or Limits()),
                    cwd=cwd,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                    **(user.process_options() if user else {}),  # type: ignore[arg-type]
                )
            except OSError as exc:
                name = errno.errorcode.get(exc.errno or 0, "?")
                why = f"cannot run {argv[0]}: {exc.strerror} ({name})"
                log.write(f"fleetq-runner: {why}\n".encode())
                return Finished(Outcome.FAILED, reason=f"launch failed: {why}", log_tail=why)
        try:
            await on_start(proc.pid, _process_start(proc.pid))
        except BaseException:
            # whatever ends supervision here must not leave the run behind, unwatched
            await terminate_group(proc.pid, grace_s=STOP_GRACE_S)
            raise
        waiter = asyncio.ensure_future(proc.wait())
        stopper = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait(
                {waiter, stopper}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopper.cancel()

        def elapsed() -> int:
            return int((time.monotonic() - started) * 1000)

        run_id = env.get("FLEETQ_RUN_ID", "")
        if waiter in done:
            # Dated by when the exit was noticed, before the clean-up: a clean-up slowed by
            # a loaded machine after a freeze must not make an exit the freeze hid look
            # measured (issue 45: a 1.2 s "measured" overlap where the records had a gap).
            noticed = time.monotonic()
            await terminate_group(proc.pid, grace_s=0)  # leftovers the command left behind
            await asyncio.to_thread(_end_run, run_id, proc.pid)
            gone = time.monotonic()
            dated = watch.dated(noticed) and watch.dated_after(noticed, gone)
            finished = exited(proc.returncode, read_tail(log_path), elapsed())
            limit = (limits or Limits()).reason(finished.signal)
            if limit is not None:
                finished = replace(finished, reason=limit)
            return replace(finished, ended_monotonic=gone, end_dated=dated)
        timed_out = stopper not in done
        stop_sent = time.monotonic()
        # still running as the stop goes out (not a zombie that exited during a freeze):
        # its end then comes after the stop, whatever stalled before
        running = _running(proc.pid)
        # the grace is read now: a self-fencing stop asks for a shorter one (see `fencing`)
        if not await terminate_group(proc.pid, grace_s=stop_grace_s(), deadline_s=STOP_DEADLINE_S):
            # Something of the group survived SIGKILL (e.g. stuck in uninterruptible I/O): do
            # not claim it stopped. The runner drains itself so an operator looks.
            waiter.cancel()
            return Finished(
                None,
                reason="stop-unconfirmed",
                log_tail=read_tail(log_path),
                run_ms=elapsed(),
                ended_monotonic=None,
            )
        await waiter
        await asyncio.to_thread(_end_run, run_id, proc.pid)
        gone = time.monotonic()
        # An end the stop caused is dated unless the loop stalled since the stop went out;
        # a process that had exited, unnoticed, before it did so during a stall, at a time
        # nobody saw: not dated (it was, by `gone`, which a slow clean-up put seconds late)
        dated = running and watch.dated_after(stop_sent, gone)
        if timed_out:
            return Finished(
                Outcome.FAILED,
                signal=_signal_of(proc.returncode),
                reason="timeout",
                log_tail=read_tail(log_path),
                run_ms=elapsed(),
                ended_monotonic=gone,
                end_dated=dated,
            )
        return Finished(
            None,
            signal=_signal_of(proc.returncode),
            reason="stopped",
            log_tail=read_tail(log_path),
            run_ms=elapsed(),
            ended_monotonic=gone,
            end_dated=dated,
        )


def _running(pid: int) -> bool:
    """Whether the process runs (is neither gone nor a zombie waiting to be reaped)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _launch_failed(log_path: Path, why: str) -> Finished:
    """Nothing ran: say why in the outcome and in the job's log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(open_private(log_path), "w") as log:
        log.write(f"fleetq-runner: {why}\n")
    return Finished(Outcome.FAILED, reason=f"launch failed: {why}", log_tail=why)


def ms_since(started: float) -> int:
    """Milliseconds since `started` (`time.monotonic()`): a run's `run_ms`."""
    return int((time.monotonic() - started) * 1000)


def _end_run(run_id: str, session: int) -> None:
    """After a run's main process is gone and its group stopped: kill what escaped the
    group (`setsid`), and reap the zombies its session left with the runner."""
    orphans.kill_run(run_id)
    orphans.reap_session(session)


async def terminate_group(pgid: int, *, grace_s: float, deadline_s: float = 30.0) -> bool:
    """SIGTERM the process group, SIGKILL what is left after `grace_s`, and wait (with a
    deadline) until no process of the group remains. True when the group is gone."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, deadline_s)):
        if not group_members(pgid):
            return True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        end = time.monotonic() + wait_s
        # no event exists for "a process group is gone": poll the process table
        while time.monotonic() < end and group_members(pgid):  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    return not group_members(pgid)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                members.append(proc.pid)
    return members


def _process_start(pid: int) -> datetime:
    try:
        return datetime.fromtimestamp(psutil.Process(pid).create_time(), UTC)
    except psutil.Error:
        return datetime.now(UTC)


def exited(returncode: int | None, tail: str, run_ms: int) -> Finished:
    """What a command's exit status comes to (negative: the signal that ended it)."""
    if returncode is None or returncode < 0:
        return Finished(
            Outcome.FAILED,
            signal=_signal_of(returncode),
            reason="signal",
            log_tail=tail,
            run_ms=run_ms,
        )
    outcome = Outcome.SUCCEEDED if returncode == 0 else Outcome.FAILED
    return Finished(
        outcome,
        exit_code=returncode,
        reason=None if returncode == 0 else "exit",
        log_tail=tail,
        run_ms=run_ms,
    )


def _signal_of(returncode: int | None) -> int | None:
    return -returncode if returncode is not None and returncode < 0 else None


def read_tail(path: Path) -> str:
    """The last TAIL_BYTES of a job's log, for its outcome ('' when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
