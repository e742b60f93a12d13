"""bench/scripts/latency_path.py still runs: it is rerun by hand when a figure is
checked, and one that broke with the code it measures (the floor's submit took a second
parameter and it failed on its first call) is only found then."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "latency_path.py"


def test_latency_path_times_every_step(server_dsn: str) -> None:
    argv = [sys.executable, str(SCRIPT), "--dsn", server_dsn, "--calls", "3", "--rounds", "1"]
    run = subprocess.run([*argv, "--rate", "200"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    steps = [line.split("  ")[0].strip() for line in run.stdout.splitlines()[1:]]
    assert steps == [
        "SELECT 1 (a round trip)",
        "INSERT, commit flushed",
        "INSERT, commit not waited",
        "floor: enqueue",
        "floor: claim",
        "fleetq: submit",
        "fleetq: claim",
    ], run.stdout
