"""One process per runner directory (`runner.pid`, flock): issue 43."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from fleetq.runner import pidfile
from fleetq.runner.identity import RunnerIdInUse

_HOLD = """
import sys, time
from pathlib import Path
from fleetq.runner import pidfile
pidfile.take(Path(sys.argv[1]), "n/r")
print("held", flush=True)
time.sleep(120)
"""


def test_a_first_process_here_has_no_predecessor_and_names_itself(tmp_path: Path) -> None:
    lock = pidfile.take(tmp_path / "r", "n/r")
    try:
        assert lock.predecessor is None
        written = json.loads((tmp_path / "r" / pidfile.FILE).read_text())
        assert written["pid"] == os.getpid() and written["runner"] == "n/r"
        assert (tmp_path / "r" / pidfile.FILE).stat().st_mode & 0o777 == 0o600
    finally:
        lock.release()


def test_a_second_hold_is_refused_while_the_first_lives(tmp_path: Path) -> None:
    lock = pidfile.take(tmp_path, "n/r")
    try:
        with pytest.raises(RunnerIdInUse, match=f"pid {os.getpid()}"):
            pidfile.take(tmp_path, "n/r")
    finally:
        lock.release()
    pidfile.take(tmp_path, "n/r").release()  # let go: taken again


def test_the_process_before_is_the_predecessor_once_gone(tmp_path: Path) -> None:
    pidfile.take(tmp_path, "n/r").release()
    lock = pidfile.take(tmp_path, "n/r")
    try:
        assert lock.predecessor is not None and lock.predecessor.pid == os.getpid()
    finally:
        lock.release()


def test_a_file_of_another_runner_or_torn_names_no_predecessor(tmp_path: Path) -> None:
    (tmp_path / pidfile.FILE).write_text('{"pid": 1, "birth": null, "runner": "n/other"}\n')
    lock = pidfile.take(tmp_path, "n/r")
    lock.release()
    assert lock.predecessor is None
    (tmp_path / pidfile.FILE).write_text('{"pid": 1, "bir')
    lock = pidfile.take(tmp_path, "n/r")
    lock.release()
    assert lock.predecessor is None


def test_a_stopped_holder_keeps_the_directory_and_is_named_stopped(tmp_path: Path) -> None:
    """SIGSTOP keeps the lock; kill -9 lets it go, and the dead process is then the
    predecessor."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path)], stdout=subprocess.PIPE, env=env
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        holder.send_signal(signal.SIGSTOP)
        _until_stopped(holder.pid)
        with pytest.raises(RunnerIdInUse, match=f"pid {holder.pid}, stopped"):
            pidfile.take(tmp_path, "n/r")
    finally:
        holder.kill()
        holder.wait()
    lock = pidfile.take(tmp_path, "n/r")
    lock.release()
    assert lock.predecessor is not None and lock.predecessor.pid == holder.pid


def _until_stopped(pid: int) -> None:
    """SIGSTOP is delivered asynchronously: wait (with a deadline) until it took."""
    end = time.monotonic() + 10
    while psutil.Process(pid).status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < end, "the holder did not stop"
        time.sleep(0.01)
