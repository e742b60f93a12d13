"""The demo's three runners, as separate `fleetq-runner` processes.

They follow Figure A of the Corvis account: runner A has no browser (browser checks are
not eligible there), runner B has a browser but little room (often "no capacity now"),
runner C has both. Each runs in a session of its own, so the terminal's Ctrl-C reaches
the demo only and the demo decides how they stop: drained through the database, then
SIGTERM, and every process of theirs verified gone. On Linux each also gets SIGTERM
should the demo itself die (a parent-death signal), so nothing strays even then.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from fleetq.core import fleet as registry
from fleetq.core import report
from fleetq.core.driver import Driver
from fleetq.core.errors import FleetqError
from fleetq.core.models import RunnerState
from fleetq.runner import orphans

START_S = 60.0  # registration deadline (a cold machine imports slowly)
DRAIN_S = 20.0  # running work may finish this long before SIGTERM
EXIT_S = 30.0  # after SIGTERM: graceful exit deadline, then a second SIGTERM, then SIGKILL
RUNNER_GRACE_S = 5  # the runners' own --grace: jobs still running at SIGTERM get this long


@dataclass(frozen=True)
class RunnerSpec:
    """One runner of the demo fleet."""

    node: str
    lanes: dict[str, int]
    capabilities: tuple[str, ...]
    memory_mb: int
    cpus: float
    about: str
    name: str = "runner"

    @property
    def runner_id(self) -> str:
        """node/name, as the runner registers."""
        return f"{self.node}/{self.name}"

    def argv(self, config: Path, work: Path) -> list[str]:
        """The runner's command line (the DSN goes in its environment, not in `ps`)."""
        argv = [sys.executable, "-m", "fleetq.runner", "--node", self.node, "--name", self.name]
        argv += ["--config", str(config), "--work-dir", str(work)]
        argv += ["--memory-mb", str(self.memory_mb), "--cpus", str(self.cpus)]
        argv += [a for lane, n in self.lanes.items() for a in ("--lane", f"{lane}={n}")]
        return argv + [a for cap in self.capabilities for a in ("--capability", cap)]


RUNNERS = (
    RunnerSpec(
        "node-a",
        {"checks": 3, "control": 1},
        ("linux",),
        4096,
        3,
        "no browser: browser checks are not eligible here",
    ),
    RunnerSpec(
        "node-b",
        {"checks": 2},
        ("linux", "browser"),
        2048,
        2,
        "browser, little room: often no capacity now",
    ),
    RunnerSpec(
        "node-c",
        {"checks": 3, "control": 2},
        ("linux", "browser"),
        6144,
        4,
        "browser and room",
    ),
)


def runner_toml(*, reap_s: float = 1.0) -> str:
    """Settings the runner flags do not cover: a reaper pass every second, so a frozen
    runner's jobs are requeued within a second of their lease expiring."""
    return f"reap_interval_s = {reap_s}\npoll_interval_s = 0.5\ngrace_s = {RUNNER_GRACE_S}\n"


class Fleet:
    """The runner processes of one demo run."""

    def __init__(self, dsn: str, work: Path, specs: tuple[RunnerSpec, ...] = RUNNERS) -> None:
        self.dsn = dsn
        self.work = work
        self.specs = specs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.paused: set[str] = set()
        self.restarted: list[str] = []  # runners killed from outside, started again

    @property
    def runner_ids(self) -> list[str]:
        """The runners' ids."""
        return [s.runner_id for s in self.specs]

    def log_path(self, runner_id: str) -> Path:
        """Where a runner's output goes."""
        return self.work / "logs" / f"{runner_id.replace('/', '__')}.log"

    async def start(self, driver: Driver) -> None:
        """Start every runner and wait until each has registered from its own process."""
        self.launch()
        await self._until_registered(driver)

    def launch(self) -> None:
        """Start the runner processes (call from the main thread: the parent-death signal
        follows the thread that forked, so a worker thread's exit would kill them)."""
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        (self.work / "runner.toml").write_text(runner_toml())
        for spec in self.specs:
            self._start(spec)

    def _start(self, spec: RunnerSpec) -> None:
        env = {**os.environ, "FLEETQ_DSN": self.dsn}
        with open(self.log_path(spec.runner_id), "ab") as out:
            self.procs[spec.runner_id] = subprocess.Popen(
                spec.argv(self.work / "runner.toml", self.work / "runners"),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                # SIGTERM, not SIGKILL: a runner hands its leases back on the way out
                preexec_fn=functools.partial(orphans.die_with_parent, os.getpid(), signal.SIGTERM),
            )

    async def _until_registered(self, driver: Driver) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            self.check_alive()
            rows = await report.runners(driver, self.runner_ids)
            mine = {r.id for r in rows if r.pid == self.procs[r.id].pid and r.state == "active"}
            if mine == set(self.procs):
                return
            await asyncio.sleep(0.1)  # polling a database condition, with a deadline
        raise FleetqError(f"runners did not register within {START_S:.0f}s; see {self.work}/logs")

    def check_alive(self, say: Callable[[str], None] = lambda _line: None) -> None:
        """Raise if a runner exited on its own (its log says why). One killed by a signal
        from outside (an operator's `kill -9`, to watch the fleet recover) is started again
        under its id, as its service manager would start it: the demo went on, where it
        ended with the error, and its jobs' recovery could not be watched. (Main thread
        only, as `launch`.)"""
        specs = {spec.runner_id: spec for spec in self.specs}
        for runner_id, proc in list(self.procs.items()):
            code = proc.poll()
            if code is not None and code < 0 and runner_id in specs:
                note = f"runner {runner_id} was killed by signal {-code}: started again"
                self.restarted.append(note)
                say(note + " (it reports the runs it lost; a run left to expire is reclaimed)")
                self._start(specs[runner_id])
            elif code is not None:
                # one line (an error is printed with its control characters escaped): how
                # it ended, its log, and the log's last line, whole
                how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
                log = self.log_path(runner_id)
                lines = log.read_text(errors="replace").splitlines() if log.exists() else []
                last = next((line for line in reversed(lines) if line.strip()), "")
                raise FleetqError(
                    f"runner {runner_id} exited ({how}); its log: {log}"
                    + (f"; its last line: {last[:300]}" if last else "")
                )

    def pause(self, runner_id: str) -> None:
        """SIGSTOP the runner process (not its jobs: they run in sessions of their own)."""
        self.procs[runner_id].send_signal(signal.SIGSTOP)
        self.paused.add(runner_id)

    def resume(self, runner_id: str) -> None:
        """SIGCONT the runner process."""
        if runner_id in self.paused and self.procs[runner_id].poll() is None:
            self.procs[runner_id].send_signal(signal.SIGCONT)
        self.paused.discard(runner_id)

    async def stop(self, driver: Driver | None) -> list[str]:
        """Drain (when the database answers), SIGTERM, wait; returns what did not go as
        it should (a runner that needed SIGKILL, a process that outlived its runner)."""
        for runner_id in list(self.paused):
            self.resume(runner_id)
        family = {rid: _family(p.pid) for rid, p in self.procs.items() if p.poll() is None}
        if driver is not None:
            with contextlib.suppress(FleetqError):
                await self._drain(driver)
        problems: list[str] = []
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for runner_id, proc in self.procs.items():
            problems += await _reap(runner_id, proc)
        family_left = [p for members in family.values() for p in members if _alive(p)]
        problems += [f"process {p.pid} ({p.name()}) outlived its runner" for p in family_left]
        problems += [f"process {pid} still runs in {self.work}" for pid in self.strays()]
        return problems

    async def _drain(self, driver: Driver) -> None:
        """Ask every live runner to drain, and wait (with a deadline) until each is
        drained: running work finishes, nothing new is claimed."""
        live = [rid for rid, p in self.procs.items() if p.poll() is None]
        for runner_id in live:
            await registry.set_state(
                driver,
                runner=runner_id,
                state=RunnerState.DRAINING,
                reason="the demo is ending",
                actor="fleetq-demo",
            )
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            rows = await report.runners(driver, live)
            if all(r.state in ("drained", "offline") for r in rows):
                return
            await asyncio.sleep(0.1)  # polling a database condition, with a deadline

    def strays(self) -> list[int]:
        """Processes still running in the demo's work directory (a job's staged tree)."""
        found: list[int] = []
        root = str(self.work.resolve())
        for proc in psutil.process_iter(["pid", "cwd"]):
            cwd = proc.info.get("cwd") or ""
            mine = proc.info["pid"] == os.getpid()
            if not mine and (cwd == root or cwd.startswith(root + os.sep)):
                found.append(int(proc.info["pid"]))
        return found


def _family(pid: int) -> list[psutil.Process]:
    """A runner's descendants right now (its job processes)."""
    with contextlib.suppress(psutil.Error):
        return list(psutil.Process(pid).children(recursive=True))
    return []


def _alive(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    return False


async def _reap(runner_id: str, proc: subprocess.Popen[bytes]) -> list[str]:
    """Wait for a SIGTERMed runner; a second SIGTERM stops its jobs at once; SIGKILL last."""
    if await _exited(proc, EXIT_S):
        return []
    proc.send_signal(signal.SIGTERM)
    if await _exited(proc, 10):
        return [f"runner {runner_id} needed a second SIGTERM"]
    proc.kill()
    if await _exited(proc, 10):
        return [f"runner {runner_id} needed SIGKILL"]
    return [f"runner {runner_id} (pid {proc.pid}) did not exit even after SIGKILL"]


async def _exited(proc: subprocess.Popen[bytes], within_s: float) -> bool:
    with contextlib.suppress(subprocess.TimeoutExpired):
        await asyncio.to_thread(proc.wait, within_s)
    return proc.poll() is not None
