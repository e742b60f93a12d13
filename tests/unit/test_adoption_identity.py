"""Which process a journaled launch is, for `--orphans adopt`: told by its birth (boot and
start in clock ticks), which no step of the wall clock moves."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator

import psutil
import pytest

from fleetq.runner import orphans
from fleetq.runner.adoption import ran_for
from fleetq.runner.collection import identify
from fleetq.runner.journal import Entry
from tests.locks import wait_for


@pytest.fixture
def run() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A launched run: its own process group, carrying its run id. Yielded once it has
    exec'd: till then the child is a fork of this process, without the run id in its
    environment (a loaded machine caught the verdict there: "refuse")."""
    run_id = str(uuid.uuid4())
    proc = subprocess.Popen(
        ["sleep", "60"], start_new_session=True, env={**os.environ, "FLEETQ_RUN_ID": run_id}
    )
    wait_for(lambda: proc.pid in orphans.carrying(run_id), "the run carries its run id")
    yield run_id, proc
    proc.kill()
    proc.wait()


def _entry(run_id: str, pid: int, started_at: float, birth: str | None) -> Entry:
    return Entry(job_id=1, token=1, run_id=run_id, pid=pid, started_at=started_at, birth=birth)


def test_a_run_is_adopted_after_the_wall_clock_stepped(
    run: tuple[str, subprocess.Popen[bytes]],
) -> None:
    # A start time taken from the wall clock moves with each step of it (psutil's is the
    # boot's wall-clock time plus the ticks since): the journal's, taken before a step
    # of 1.5 s, differs from what the same process reads as after it.
    run_id, proc = run
    stepped = psutil.Process(proc.pid).create_time() - 1.5
    verdict, evidence = identify(_entry(run_id, proc.pid, stepped, orphans.birth(proc.pid)))
    assert verdict == "adopt", evidence


def test_another_process_under_the_journaled_pid_is_refused(
    run: tuple[str, subprocess.Popen[bytes]],
) -> None:
    run_id, proc = run
    birth = orphans.birth(proc.pid)
    assert birth is not None
    boot, ticks = birth.rsplit(":", 1)
    started = psutil.Process(proc.pid).create_time()
    for other in (f"{boot}:{int(ticks) - 1}", f"another-boot:{ticks}"):
        verdict, evidence = identify(_entry(run_id, proc.pid, started, other))
        assert (verdict, evidence.get("why")) == ("refuse", "pid reused: another start")


def test_a_launch_journaled_before_births_is_told_by_its_start_time(
    run: tuple[str, subprocess.Popen[bytes]],
) -> None:
    run_id, proc = run
    started = psutil.Process(proc.pid).create_time()
    assert identify(_entry(run_id, proc.pid, started, None))[0] == "adopt"
    assert identify(_entry(run_id, proc.pid, started - 1.5, None))[0] == "refuse"


def test_a_process_that_is_gone_has_no_birth() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert orphans.birth(proc.pid) is None


def test_an_adopted_run_s_time_is_not_moved_by_the_wall_clock(
    run: tuple[str, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # its timeout counts from its start: a wall clock stepped an hour ahead since the
    # launch made an adopted run look an hour old, and it was stopped as timed out
    _, proc = run
    started = psutil.Process(proc.pid).create_time()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    assert 0 <= ran_for(proc.pid, started) < 60
    proc.kill()
    proc.wait()
    assert ran_for(proc.pid, started) > 3600  # gone: only the wall clock is left
