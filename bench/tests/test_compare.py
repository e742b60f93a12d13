"""`fleetq-bench --compare` runs fleetq and a peer end to end with small numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

FIGURES = {
    "throughput.jobs_per_s",
    "throughput.drain_jobs_per_s",
    "throughput.enqueue_seconds",
    "latency.enqueue_to_start_ms.p50",
    "latency.enqueue_to_start_ms.p99",
    "throughput.costs.write_xacts_per_job",
    "throughput.costs.statements_per_job",
    "throughput.costs.xacts_per_job",
    "throughput.costs.wal_bytes_per_job",
    "throughput.costs.worker_cpu_ms_per_job",
    "throughput.costs.server_cpu_ms_per_job",
    "latency.costs.write_xacts_per_job",
}


def _compare(
    server_dsn: str, *extra: str, systems: str = "fleetq,pgqueuer-default"
) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable, "-m", "fleetq_bench", "--dsn", server_dsn, "--compare",
        "--systems", systems, "--jobs", "200", "--runs", "1",
        "--runners", "2", "--warmup", "20", "--rate", "50", "--latency-seconds", "0.5",
        "--idle-seconds", "0.5", "--settle", "0", *extra,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)


def test_compare_reports_each_systems_figures(server_dsn: str, tmp_path: Path) -> None:
    """One run of fleetq and a peer (each row costs a compare's worth of processes):
    its JSON report, its Markdown tables and its plots."""
    plots = tmp_path / "plots"
    run = _compare(
        server_dsn, "--json-out", str(tmp_path / "report.json"), "--markdown", "--plot", str(plots)
    )
    assert run.returncode == 0, run.stderr
    report: dict[str, Any] = json.loads((tmp_path / "report.json").read_text())
    assert report["runs"] == 1
    assert report["plan"]["jobs"] == 200
    assert report["versions"]["pgqueuer"] == "1.6.0"
    rows = {row["system"]: row for row in report["systems"]}
    assert list(rows) == ["fleetq", "pgqueuer-default"]
    assert rows["fleetq"]["in_flight_per_worker"] == 512
    assert rows["pgqueuer-default"]["in_flight_per_worker"] is None
    assert rows["pgqueuer-default"]["batch"] == 10
    for row in rows.values():
        (raw,) = row["runs"]
        assert raw["throughput"]["jobs"] == raw["throughput"]["succeeded"] == 200
        assert raw["latency"]["jobs"] == 25
        assert raw["latency"]["enqueue_to_start_ms"]["p50"] > 0
        assert raw["harness_calls"]["submit"]["statements"] >= 1
        assert set(row["summary"]) >= FIGURES
        # every job writes something: its claim or its outcome at least
        assert row["summary"]["throughput.costs.write_xacts_per_job"]["median"] > 0
        assert raw["throughput"]["costs"]["wal_bytes_per_job"] > 0
    # --markdown prints the docs' tables instead of the JSON
    assert "| fleetq | 512 | 256 |" in run.stdout
    assert "| pgqueuer-default | unset | 10 |" in run.stdout
    pngs = sorted(p.name for p in plots.iterdir())
    assert pngs == ["latency.png", "throughput.png", "write_xacts.png"]
    assert all((plots / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)
    print(json.dumps(report))  # the figures, in the test log


def test_the_floor_runs_every_job_once(server_dsn: str) -> None:
    """The floor needs no peer's library: its rows run wherever fleetq does,
    and each job is claimed and ended exactly once (its span counts a job succeeded only
    when it ended, claimed once: a job claimed twice, or never ended, fails this)."""
    run = _compare(server_dsn, systems="floor-cap8")
    assert run.returncode == 0, run.stderr
    (row,) = json.loads(run.stdout)["systems"]
    assert (row["system"], row["kind"], row["in_flight_per_worker"]) == ("floor-cap8", "floor", 8)
    (raw,) = row["runs"]
    assert raw["throughput"]["jobs"] == raw["throughput"]["succeeded"] == 200
    assert raw["latency"]["jobs"] == 25
    assert raw["latency"]["enqueue_to_start_ms"]["p50"] > 0
    # a claim and the ends' write per batch of 8 at least: more than nothing, far below 2
    assert 0 < row["summary"]["throughput.costs.write_xacts_per_job"]["median"] < 2


def test_unknown_system_is_a_usage_error(server_dsn: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "fleetq_bench", "--dsn", server_dsn, "--compare",
         "--systems", "fleetq,rabbitmq"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 64, run.stderr
    assert "unknown system(s) rabbitmq" in run.stderr
