"""`fleetq demo --headless`: the whole story on a short run, as CI sees it (issue #7)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from fleetq.core.db import connect

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DURATION_S = 20


def _runner_processes(dsn: str) -> list[int]:
    """fleetq-runner processes connected to `dsn` (the demo hands them the DSN in their
    environment)."""
    found: list[int] = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if "fleetq.runner" not in (proc.info.get("cmdline") or []):
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("FLEETQ_DSN") == dsn:
                found.append(int(proc.info["pid"]))
    return found


def test_a_short_headless_demo_accounts_for_every_job(db_dsn: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FLEETQ_DSN"}
    env["PYTHONPATH"] = str(ROOT)
    argv = [sys.executable, "-m", "fleetq", "--dsn", db_dsn, "demo", "--headless"]
    done = subprocess.run(
        [*argv, "--duration", str(DURATION_S)],
        capture_output=True,
        text=True,
        timeout=DURATION_S + 150,
        env=env,
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

    with connect(db_dsn) as conn:
        live = conn.execute(
            "SELECT count(*) FROM fleetq.jobs WHERE state IN ('queued', 'claimed', 'running')"
        ).fetchone()
        superseded = conn.execute(
            "SELECT count(*) FROM fleetq.executions "
            "WHERE stop_reason = 'superseded' AND stop_confirmed"
        ).fetchone()
        states = conn.execute("SELECT DISTINCT state FROM fleetq.runners").fetchall()
        idempotent = conn.execute(
            "SELECT count(*) FROM fleetq.jobs WHERE idempotency_key IS NOT NULL"
        ).fetchone()
    assert live == (0,)
    assert superseded is not None and superseded[0] >= 1
    assert states == [("offline",)]
    accepted = re.search(r"jobs: (\d+) accepted from (\d+) submits \((\d+) repeated", out)
    assert accepted and idempotent == (int(accepted[1]),)
    assert int(accepted[2]) == int(accepted[1]) + int(accepted[3]) and int(accepted[3]) >= 1
    assert _runner_processes(db_dsn) == []
