"""`fleetq-bench` runs end to end with small numbers and prints its figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_bench_prints_figures(server_dsn: str) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetq_bench",
            "--dsn",
            server_dsn,
            "--jobs",
            "300",
            "--runners",
            "2",
            "--rate",
            "50",
            "--latency-seconds",
            "0.5",
            "--warmup",
            "20",
            "--idle-seconds",
            "1",
            "--settle",  # statistics' flush wait: accuracy, not what this test checks
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["throughput"]["jobs"] == report["throughput"]["succeeded"] == 300
    assert report["throughput"]["jobs_per_s"] > 0
    assert report["warmup_jobs"] == 20
    assert report["latency"]["jobs"] == 25
    latency = report["latency"]
    assert set(latency["enqueue_to_start_ms"]) == {"p50", "p95", "p99"}
    # on the producer's clock a start can never come before its submit, and it includes
    # what the database's own timestamps leave out (the submit's commit, the wake-up)
    assert latency["enqueue_to_start_ms"]["p50"] > 0
    assert set(latency["database_created_to_claimed_ms"]) == {"p50", "p95", "p99"}
    assert report["idle"]["transactions_per_runner_s"] >= 0
    print(json.dumps(report))  # the figures, in the test log
