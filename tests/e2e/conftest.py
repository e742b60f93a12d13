"""Real `fleetq-runner` processes against a real database and a real git repository."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetq.core import config
from fleetq.core.db import SyncConnection, connect

ROOT = Path(__file__).resolve().parents[2]
CHECK = """\
import os, subprocess, sys
status = subprocess.check_output(["git", "status", "--porcelain"], text=True)
head = subprocess.check_output(["git", "rev-parse", "HEAD"], text=True).strip()
print(f"status={status!r} head={head} token={os.environ['FLEETQ_FENCING_TOKEN']}")
print("dsn leaked" if any("DSN" in k or k.startswith("PG") for k in os.environ) else "env clean")
sys.exit(0 if status == "" and head == os.environ["FLEETQ_COMMIT"] else 3)
"""


@dataclass
class Repo:
    """A test repository: `old` is a commit that is not HEAD."""

    path: Path
    old: str
    head: str


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    path = tmp_path / "repo"
    path.mkdir()
    _git(path, "init", "-q")
    _git(path, "config", "user.email", "t@example.com")
    _git(path, "config", "user.name", "t")
    (path / "check.py").write_text(CHECK)
    _git(path, "add", ".")
    _git(path, "commit", "-qm", "one")
    old = _git(path, "rev-parse", "HEAD")
    (path / "check.py").write_text("import sys; sys.exit(9)\n")
    _git(path, "commit", "-qam", "two")
    return Repo(path=path, old=old, head=_git(path, "rev-parse", "HEAD"))


FLEET = """
[settings]
lease_seconds = {lease}
[lanes.checks]
[lanes.control]
[projects.repo]
repository = "{repo}"
[projects.repo.operations.check]
lane = "checks"
command = "python3 check.py"
[projects.repo.operations.sleep]
lane = "checks"
command = "sleep {sleep}"
timeout_seconds = 120
[projects.repo.operations.hang]
lane = "checks"
command = "sh -c 'sleep 300 & sleep 300'"
timeout_seconds = 1
[projects.repo.operations.browser]
lane = "checks"
command = "true"
capabilities = ["browser"]
[projects.repo.operations.ping]
lane = "control"
handler = "fleetq.runner.handlers:echo"
[projects.repo.operations.effect]
lane = "control"
handler = "tests.handlers:record_effect"
[projects.repo.operations.exactly_once]
lane = "control"
handler = "tests.handlers:record_effect_exactly_once"
[projects.repo.operations.forever]
lane = "checks"
handler = "tests.handlers:wait_forever"
[projects.repo.operations.until]
lane = "checks"
handler = "tests.handlers:until_file"
memory_mb = 600
[projects.repo.operations.until_control]
lane = "control"
handler = "tests.handlers:until_file"
memory_mb = 600
[projects.repo.operations.stall]
lane = "control"
handler = "tests.handlers:effect_then_stall"
[projects.repo.operations.stall_once]
lane = "control"
handler = "tests.handlers:effect_then_stall_once"
[projects.repo.operations.nul]
lane = "checks"
command = "python3 -c 'import sys; sys.stdout.write(chr(0) * 3)'"
[projects.repo.operations.hold]
lane = "control"
handler = "tests.handlers:hold_transaction"
[projects.repo.operations.hold_then_run]
lane = "control"
handler = "tests.handlers:hold_then_run"
[projects.repo.operations.peek]
lane = "checks"
command = "sh -c 'id -un; cat /proc/$PPID/environ > /dev/null 2>&1 && echo LEAKED || echo DENIED'"
[projects.repo.operations.flood]
lane = "checks"
command = "head -c 5000000 /dev/zero"
[projects.repo.operations.flood.limits]
output_mb = 1
[projects.repo.operations.spin]
lane = "checks"
command = "python3 -c 'while True: pass'"
timeout_seconds = 60
[projects.repo.operations.spin.limits]
cpu_seconds = 1
[projects.repo.operations.chatty]
lane = "checks"
command = "true"
[projects.repo.operations.bulky]
lane = "checks"
command = "python3 -c 'print(300000 * chr(120))'"
[projects.repo.operations.trace]
lane = "checks"
command = "sh -c 'echo TP=[$TRACEPARENT]'"
[projects.repo.operations.oserror]
lane = "control"
handler = "tests.handlers:own_oserror"
"""


@pytest.fixture
def fleet_dsn(db_dsn: str, repo: Repo, tmp_path: Path) -> str:
    """A database with the test fleet's configuration applied."""
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET.format(repo=repo.path, lease=30, sleep=2))
    with connect(db_dsn) as conn:
        config.apply(conn, config.load(path), source=path)
        conn.execute("CREATE TABLE effects (job_id bigint, token bigint)")
        conn.commit()
    return db_dsn


@dataclass
class RunnerProcess:
    """A running fleetq-runner and where its log goes."""

    proc: subprocess.Popen[bytes]
    log: Path
    runner_id: str

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)


StartRunner = Callable[..., RunnerProcess]


@pytest.fixture
def start_runner(fleet_dsn: str, tmp_path: Path) -> Iterator[StartRunner]:
    started: list[RunnerProcess] = []

    def start(
        node: str = "node-a",
        name: str = "r",
        *,
        lanes: tuple[str, ...] = ("checks=2", "control=1"),
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        dsn: str | None = None,
        via: tuple[str, ...] | None = None,
        expect_exit: bool = False,
    ) -> RunnerProcess:
        """A runner on `dsn` (default: the fleet's), or `via` these arguments instead
        (`--api URL --token-file F`); `expect_exit`: one that is to be refused at start."""
        log = tmp_path / f"{node}-{name}.log"
        if log.exists():  # a second process of the runner: a log of its own
            log = tmp_path / f"{node}-{name}-{len(started)}.log"
        argv = [
            sys.executable,
            "-m",
            "fleetq.runner",
            *(via if via is not None else ("--dsn", dsn or fleet_dsn)),
            "--node",
            node,
            "--name",
            name,
            "--work-dir",
            str(tmp_path / "work"),
            "--poll",
            "0.2",
            *[a for lane in lanes for a in ("--lane", lane)],
            *extra,
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        runner = RunnerProcess(proc=proc, log=log, runner_id=f"{node}/{name}")
        started.append(runner)
        wait_until(
            lambda: "serving" in runner.output() or proc.poll() is not None,
            what=f"runner {runner.runner_id} to start",
        )
        if expect_exit:
            proc.wait(timeout=30)
        else:
            assert proc.poll() is None, runner.output()
        return runner

    yield start
    for runner in started:
        stop(runner)


def stop(runner: RunnerProcess) -> None:
    """SIGTERM; once shutting down, SIGTERM again (stop running jobs now); then kill."""
    if runner.proc.poll() is not None:
        return
    runner.proc.send_signal(signal.SIGTERM)
    wait_until(
        lambda: "shutting down" in runner.output() or runner.proc.poll() is not None,
        what="the runner to begin shutting down",
    )
    if runner.proc.poll() is None:
        runner.proc.send_signal(signal.SIGTERM)  # two signals sent at once would merge
    try:
        runner.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        runner.proc.kill()
        runner.proc.wait()
        pytest.fail(f"runner {runner.runner_id} did not stop:\n{runner.output()}")


def wait_until(
    predicate: Callable[[], object],
    *,
    what: str,
    deadline_s: float = 30,
    show: Callable[[], str] | None = None,
) -> None:
    """Poll a condition until it holds; fail with `what` (and what `show` tells, such as
    a runner's output) after the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    told = f"\n{show()}" if show is not None else ""
    pytest.fail(f"timed out after {deadline_s}s waiting for {what}{told}")


def job_state(conn: SyncConnection, job_id: int) -> str:
    row = conn.execute("SELECT state FROM fleetq.jobs WHERE id = $1", [job_id]).fetchone()
    assert row is not None
    return str(row[0])
