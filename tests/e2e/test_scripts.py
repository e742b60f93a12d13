"""The measurement scripts the performance notes quote still run: each is rerun by hand
when a figure is checked, and one that broke with the code it measures (the floor's
submit took a second parameter and `latency_path.py` failed on its first call) is only
found then. (The benchmarks' own, bench/scripts/, are bench/tests/'s.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _run(server_dsn: str, script: str, *args: str) -> str:
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), "--dsn", server_dsn, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_call_costs_measures_its_calls(server_dsn: str) -> None:
    out = _run(server_dsn, "call_costs.py", "--calls", "20", "--batches", "1,8")
    assert "cycle 8" in out, out
