"""The console's CPU while nothing changes, per view: the issue 45 bar is 2 % per view at
160x48 with 2,000 jobs.

    uv run python scripts/console_idle_cpu.py [--dsn DSN] [--jobs N] [--seconds S]
                                              [--code DIR] [--views 1,3,6]

Fills a scratch database as scripts/console_bench.py does (on --dsn, else a throwaway
embedded server), starts the real `fleetq-console` in a pseudo-terminal of the given size
(`--code DIR`: the fleetq package from DIR instead, e.g. a `git archive` of an older
commit, to compare), waits for each view to settle, then reads the process's CPU time
over the window and prints one row per view.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleetq.core import migrate  # noqa: E402
from fleetq.core.db import connect, resolve_dsn  # noqa: E402

VIEWS = {
    "1": "overview",
    "2": "lanes",
    "3": "jobs",
    "4": "detail",
    "5": "runners",
    "6": "events",
    "7": "overlaps",
    "8": "schedules",
}


def fill(dsn: str, jobs: int, runners: int) -> None:
    """The fleet of scripts/console_bench.py, and a submitted event per job (what a
    2,000-job submit leaves in the history the events view reads)."""
    path = ROOT / "scripts/console_bench.py"
    spec = importlib.util.spec_from_file_location("console_bench", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.fill(dsn, jobs, runners)
    with connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO fleetq.events (kind, job_id, actor) "
            "SELECT 'submitted', id, submitted_by FROM fleetq.jobs ORDER BY id"
        )
        # Idle means nothing changes: the running jobs' leases neither expire nor move
        # during the measurement (a countdown near expiry is redrawn every second).
        conn.execute(
            "UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() + interval '2 hours' "
            "WHERE state = 'running'"
        )


@contextlib.contextmanager
def server(dsn: str | None) -> Iterator[str]:
    """The given server, else an embedded one for as long as the block runs."""
    if dsn:
        yield resolve_dsn(dsn)
        return
    from tests.conftest import embedded_server

    with embedded_server() as started:
        yield started


class Console:
    """`fleetq-console` in a pseudo-terminal of `size`, its output drained and dropped."""

    def __init__(self, dsn: str, size: tuple[int, int], code: Path | None) -> None:
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "FLEETQ_DSN": dsn}
        if code is not None:
            env["PYTHONPATH"] = str(code)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fleetq.console.main", "--dsn", dsn],
            stdin=follower,
            stdout=follower,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=str(code or ROOT),
            start_new_session=True,
        )
        os.close(follower)
        self.leader = leader
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self.leader, 65536):
                pass

    def press(self, keys: str) -> None:
        """Type `keys` into the console."""
        os.write(self.leader, keys.encode())

    def cpu_percent(self, seconds: float) -> float:
        """The process's CPU over the next `seconds`, in % of one core."""
        proc = psutil.Process(self.process.pid)
        before = proc.cpu_times()
        start = time.monotonic()
        time.sleep(seconds)
        after = proc.cpu_times()
        used = (after.user + after.system) - (before.user + before.system)
        return 100.0 * used / (time.monotonic() - start)

    def stop(self) -> None:
        """Quit the console (q), or end it."""
        self.press("q")
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self.leader)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="server to use (default: $FLEETQ_DSN, else embedded)")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--runners", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20.0, help="measured per view")
    parser.add_argument("--settle", type=float, default=6.0, help="wait after switching")
    parser.add_argument("--size", default="160x48")
    parser.add_argument("--views", default="1,2,3,5,6,7,8", help="view keys, in order")
    parser.add_argument("--code", type=Path, help="run the fleetq package found in DIR")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    with (
        server(args.dsn or os.environ.get("FLEETQ_DSN")) as base,
        migrate.scratch_database(base, "fleetq_console_idle") as dsn,
    ):
        fill(dsn, args.jobs, args.runners)
        console = Console(dsn, (width, height), args.code)
        try:
            time.sleep(args.settle * 2)  # start-up and the first read
            print(
                f"{args.jobs} jobs, {args.runners} runners, {width}x{height}, "
                f"{args.seconds:g} s a view, code: {args.code or ROOT}"
            )
            print(f"{'view':12} {'idle CPU %':>10}")
            for key in args.views.split(","):
                console.press(key)
                time.sleep(args.settle)
                print(f"{VIEWS[key]:12} {console.cpu_percent(args.seconds):10.1f}", flush=True)
        finally:
            console.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
