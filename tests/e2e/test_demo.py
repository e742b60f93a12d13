"""`fleetq demo --headless`: the whole story on a short run, as CI sees it (issue #7)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from psycopg.conninfo import conninfo_to_dict

from fleetq.core.db import SyncConnection, connect
from tests.e2e.conftest import StartRunner

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DURATION_S = 20
START_S = 120  # a cold machine: migrations, repositories, three runners


def _runner_processes(database: str) -> list[int]:
    """fleetq-runner processes connected to `database` (the demo hands them the DSN in
    their environment)."""
    found: list[int] = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if "fleetq.runner" not in (proc.info.get("cmdline") or []):
            continue
        with contextlib.suppress(psutil.Error):
            dsn = proc.environ().get("FLEETQ_DSN")
            if dsn and conninfo_to_dict(dsn).get("dbname") == database:
                found.append(int(proc.info["pid"]))
    return found


def _fleet(conn: SyncConnection) -> dict[str, object]:
    """What a demo must leave alone in the user's database: settings (with when they were
    written), lanes, projects, runners and their states, jobs, events."""
    return {
        "settings": conn.execute(
            "SELECT name, value, updated_at FROM fleetq.settings ORDER BY name"
        ).fetchall(),
        "lanes": conn.execute("SELECT name FROM fleetq.lanes ORDER BY name").fetchall(),
        "projects": conn.execute("SELECT name FROM fleetq.projects ORDER BY name").fetchall(),
        "runners": conn.execute(
            "SELECT id, state, fleetq.runner_is_stale(last_heartbeat_at) FROM fleetq.runners"
        ).fetchall(),
        "jobs": conn.execute("SELECT count(*) FROM fleetq.jobs").fetchall(),
    }


def _demo(dsn: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "fleetq", "--dsn", dsn, "demo", "--headless", *args]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FLEETQ_DSN"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_a_short_headless_demo_accounts_for_every_job_and_leaves_your_fleet_alone(
    fleet_dsn: str, demo_dsn: str, start_runner: StartRunner, tmp_path: Path
) -> None:
    """Issue 42: beside a fleet of the user's own (lease 30, a runner serving the demo's
    lanes, able to run every demo check), the demo, started with --reset, runs in its own
    database; the user's settings, runner and (empty) queue are as they were."""
    mine = start_runner(
        "my-node",
        extra=("--capability", "linux", "--capability", "browser", "--memory-mb", "16384"),
        lanes=("checks=4", "control=2"),
    )
    with connect(fleet_dsn) as conn:
        before = _fleet(conn)
    assert before["runners"] == [(mine.runner_id, "active", False)]

    done = subprocess.run(
        [*_demo(fleet_dsn, "--reset"), "--duration", str(DURATION_S)],
        capture_output=True,
        text=True,
        timeout=DURATION_S + 150,
        env=_env(),
        cwd=tmp_path,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "every accepted job is accounted for" in out, out
    proved = re.search(r"(\d+) reassignment\(s\), (\d+) superseded stop\(s\) confirmed", out)
    assert proved and int(proved[1]) >= 1 and int(proved[2]) >= 1, out
    window = re.search(r"proved: overlap window measured \((\d+\.\d+)s, end confirmed\)", out)
    assert window and float(window[1]) > 0, out
    assert "runners drained and stopped, no stray process" in out
    assert "verdict: OK" in out and "warning:" not in out, out

    # the user's fleet: the same settings (never rewritten), its runner active and not
    # offline, the one runner, no job, the schema still there after --reset
    with connect(fleet_dsn) as conn:
        assert _fleet(conn) == before
    assert mine.proc.poll() is None, mine.output()

    with connect(demo_dsn) as conn:
        live = conn.execute(
            "SELECT count(*) FROM fleetq.jobs WHERE state IN ('queued', 'claimed', 'running')"
        ).fetchone()
        superseded = conn.execute(
            "SELECT count(*) FROM fleetq.executions "
            "WHERE stop_reason = 'superseded' AND stop_confirmed"
        ).fetchone()
        states = conn.execute("SELECT DISTINCT state FROM fleetq.runners").fetchall()
        claimed_by = conn.execute(
            "SELECT DISTINCT split_part(runner_id, '/', 1) FROM fleetq.executions ORDER BY 1"
        ).fetchall()
        idempotent = conn.execute(
            "SELECT count(*) FROM fleetq.jobs WHERE idempotency_key IS NOT NULL"
        ).fetchone()
        lease = conn.execute(
            "SELECT value FROM fleetq.settings WHERE name = 'lease_seconds'"
        ).fetchone()
    assert live == (0,)
    assert superseded is not None and superseded[0] >= 1
    assert states == [("offline",)]
    assert claimed_by == [("node-a",), ("node-b",), ("node-c",)]  # the demo's runners only
    assert lease == (3,)
    accepted = re.search(r"jobs: (\d+) accepted from (\d+) submits \((\d+) repeated", out)
    assert accepted and idempotent == (int(accepted[1]),)
    assert int(accepted[2]) == int(accepted[1]) + int(accepted[3]) and int(accepted[3]) >= 1
    assert _runner_processes(str(conninfo_to_dict(demo_dsn)["dbname"])) == []


def test_a_second_demo_is_refused_for_now_and_ctrl_c_ends_the_first_with_130(
    db_dsn: str, demo_dsn: str, tmp_path: Path
) -> None:
    """Issue 42, item 8: a second demo while one runs exits 75 (try again later), not 70;
    Ctrl-C ends a demo with 130, its report printed, no traceback, not 0."""
    with open(tmp_path / "first.err", "w+") as first_err:
        first = subprocess.Popen(
            [*_demo(db_dsn), "--duration", "300"],
            stdout=subprocess.PIPE,
            stderr=first_err,
            text=True,
            env=_env(),
            cwd=tmp_path,
        )
        lines: list[str] = []
        streaming = threading.Event()

        def read() -> None:
            assert first.stdout is not None
            for line in first.stdout:
                lines.append(line)
                if line.startswith("runner node-c/runner"):  # the last runner is up
                    streaming.set()
            streaming.set()  # ended early: the assertions below say how

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            assert streaming.wait(START_S), "".join(lines)
            assert first.poll() is None, "".join(lines) + first_err.read()
            second = subprocess.run(
                [*_demo(db_dsn), "--duration", "5"],
                capture_output=True,
                text=True,
                timeout=START_S,
                env=_env(),
                cwd=tmp_path,
            )
            first.send_signal(signal.SIGINT)
            first.wait(timeout=START_S + 120)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        reader.join(timeout=START_S)
        first_err.seek(0)
        err = first_err.read()
    out = "".join(lines)
    assert (second.returncode, first.returncode) == (75, 130), (second.stderr, out, err)
    assert "another fleetq demo is running" in second.stderr, second.stderr
    assert "Traceback" not in err + second.stderr, err
    assert "interrupted: ending the job stream" in out and "verdict:" in out, out
    assert _runner_processes(str(conninfo_to_dict(demo_dsn)["dbname"])) == []
