"""No job outlives its run: not a `setsid` grandchild, not after a kill -9 of the runner.

Three layers, because each alone has a gap:
- the runner is a *child subreaper* (Linux prctl), so processes a job orphans are
  reparented to the runner rather than to init, and the runner can reap them;
- every job's main process gets a *parent-death signal* (SIGKILL), so a kill -9 of the
  runner takes the job with it instead of leaving it running unowned;
- when a run ends, every process still carrying its `FLEETQ_RUN_ID` in its environment
  (a grandchild that escaped the process group with `setsid`) is killed and reaped, and
  so is what is left of its session (`reap_session`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def make_undumpable() -> bool:
    """Make this process non-dumpable (Linux): its /proc files (environ, mem, fds) are
    closed to other processes of its uid, jobs included; no core dumps. A job's own
    exec makes it dumpable again, so jobs are not affected."""
    return _prctl(PR_SET_DUMPABLE, 0)


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux)."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """In a freshly forked child: receive `sig` when the parent dies. If it already died
    between fork and here, exit now."""
    _prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:
        os._exit(1)


def carrying(run_id: str) -> list[int]:
    """Live processes whose environment carries FLEETQ_RUN_ID=run_id."""
    marker = f"FLEETQ_RUN_ID={run_id}".encode()
    found: list[int] = []
    for proc in psutil.process_iter(["pid", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/environ", "rb") as f:
            if marker in f.read().split(b"\0"):
                found.append(proc.pid)
    return found


def reap_session(sid: int) -> list[int]:
    """Reap the zombies a job's session left with this process: a background child the
    job orphaned (reparented here, the subreaper) that exited or was killed with its
    group. Nothing else waits for them, and each zombie holds a pid for as long as the
    runner lives. Only the job's own session, never its leader (the job's main process):
    every other child of the runner (another job's main process, staging's git) is the
    event loop's to wait for, and taking its exit status would make that wait fail.
    Returns the pids reaped."""
    reaped: list[int] = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error, OSError):
            if child.pid == sid or child.status() != psutil.STATUS_ZOMBIE:
                continue
            if os.getsid(child.pid) == sid and os.waitpid(child.pid, os.WNOHANG)[0]:
                reaped.append(child.pid)
    return reaped


def kill_run(run_id: str, *, deadline_s: float = 2.0) -> list[int]:
    """SIGKILL every process whose environment carries FLEETQ_RUN_ID=run_id, until none
    is left (or the deadline passes), and reap those that are (now) our children.
    Returns their pids. A group the run leads is killed whole, and the scan repeats: a
    shell forks its next child between one scan and its kill, and that child carries
    the run id too."""
    killed: list[int] = []
    end = time.monotonic() + deadline_s
    while found := carrying(run_id):
        for pid in found:
            with contextlib.suppress(OSError):
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
            if pid not in killed:
                killed.append(pid)
        for pid in found:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0)  # only our own (adopted) children can be waited for
        if time.monotonic() >= end:
            break
        time.sleep(0.01)  # a killed process leaves /proc when its parent reaps it
    return killed


def birth(pid: int) -> str | None:
    """What tells this process from a later one with its pid: the boot it started in
    and when, in clock ticks since that boot (`/proc/PID/stat`, field 22). Not the start
    time psutil reports: that is the boot's wall-clock time plus those ticks, and the
    boot's wall-clock time moves with every step of the wall clock (an NTP correction, a
    VM's resync), so a run launched before a step looked like another process after it,
    and its adoption was refused. None when the process is gone (or not on Linux)."""
    ticks = _start_ticks(pid)
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return None
    return None if ticks is None else f"{boot}:{ticks}"


def age(pid: int) -> float | None:
    """Seconds since the process started, on the boot's clock (which no step of the wall
    clock moves); None when it is gone."""
    ticks = _start_ticks(pid)
    if ticks is None:
        return None
    return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")


def _start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (`/proc/PID/stat`, field 22)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: count after its end
    return int(stat[stat.rindex(b")") + 2 :].split()[19])
