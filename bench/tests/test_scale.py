"""The scale and check-job benchmarks run end to end with small numbers."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleetq_bench import checkjobs, scale
from fleetq_bench.pgbouncer import installed as pgbouncer_installed

pytestmark = pytest.mark.slow


def _args(add: object, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add(parser)  # type: ignore[operator]
    return parser.parse_args(argv)


def _percentiles_sane(found: dict[str, float | int | None]) -> None:
    assert found["n"]
    values = [found["p50"], found["p95"], found["p99"]]
    assert all(v is not None and v >= 0 for v in values), found
    assert values == sorted(values), found  # type: ignore[type-var]


def test_scale_benchmark_small(server_dsn: str, tmp_path: Path) -> None:
    args = _args(
        scale.add_arguments,
        [
            "--runners",
            "1,3",
            "--jobs",
            "200",
            "--warmup",
            "20",
            "--idle-seconds",
            "1",
            "--idle-settle",
            "0.5",
            "--history",
            "10000",
            "--history-batch",
            "4000",
            "--probe-jobs",
            "50",
            "--probe-runners",
            "2",
            "--timeout",
            "120",
        ],
    )
    report = scale.run(server_dsn, args)
    json.dumps(report)  # it is a JSON report
    assert [s["runners"] for s in report["steps"]] == [1, 3]
    for step in report["steps"]:
        assert step["jobs"] == step["succeeded"] == 200
        assert step["drain_s"] > 0 and step["jobs_per_s"] > 0
        assert step["claim_calls"] + step["refill_calls"] >= 200 / (4 * 3)
        assert step["stale_writes"] == 0
        _percentiles_sane(step["claim_ms"])
    idle = report["idle"]
    assert idle["runners"] == 3 and idle["transactions_per_s"] >= 0 and idle["xids_per_s"] >= 0
    history = report["history"]
    assert history["finished_jobs_added"] == 10_000
    before, after, pruned = history["before"], history["after"], history["after_prune"]
    assert after["finished_jobs"] - before["finished_jobs"] == 10_000 + 50
    # the prune took the history (an hour old), not the probes' jobs (minutes old)
    assert history["prune"]["jobs"] == 10_000 and history["prune"]["jobs_per_s"] > 0
    assert pruned["finished_jobs"] == after["finished_jobs"] - 10_000 + 50
    for probe in (before, after, pruned):
        assert probe["jobs"] == probe["succeeded"] == 50
        _percentiles_sane(probe["claim_ms"])
        # the test server's login is a superuser, so auto_explain is there to read
        assert probe["explain"]["shared_hit"] > 0
        assert "jobs_queued" in probe["explain"]["candidates_indexes"]


def test_scale_benchmark_direct_and_through_gateways(server_dsn: str) -> None:
    """Both ways in, one run: the same bursts drained directly and through two `fleetq
    api` processes (their pools through PgBouncer when it is installed), each with its
    server connections and idle cost."""
    bouncer = ["--pgbouncer"] if pgbouncer_installed() else []
    argv = ["--runners", "3", "--jobs", "60", "--warmup", "0", "--history", "0"]
    argv += ["--idle-seconds", "1", "--idle-settle", "0.5", "--via", "direct,gateways"]
    report = scale.run(server_dsn, _args(scale.add_arguments, [*argv, *bouncer]))
    json.dumps(report)
    assert [(s["via"], s["runners"]) for s in report["steps"]] == [
        ("direct", 3),
        ("gateways", 3),
    ]
    for step in report["steps"]:
        assert step["jobs"] == step["succeeded"] == 60, step
        assert step["stale_writes"] == 0
        _percentiles_sane(step["claim_ms"])
    direct, gateways = report["steps"]
    assert direct["server_connections"]["max"] == 3  # a connection per simulated runner
    # two gateways' pools (10 each at most) and their LISTEN sessions, whatever the fleet
    assert 2 <= gateways["server_connections"]["max"] <= 2 * 10 + 2
    assert [i["via"] for i in report["idles"]] == ["direct", "gateways"]


def test_check_jobs_benchmark_small(server_dsn: str) -> None:
    args = _args(
        checkjobs.add_arguments,
        ["--jobs", "1", "--new-commits", "1", "--cold", "1", "--files", "5"],
    )
    report = checkjobs.run(server_dsn, args)
    json.dumps(report)
    assert report["jobs"] == report["succeeded"] == 3
    assert set(report["staging_ms"]) == {"cold", "warm_same_commit", "warm_new_commit"}
    for kind in report["staging_ms"].values():
        assert kind["n"] == 1 and kind["p50"] is not None and kind["p50"] >= 0
    for name in ("overhead_ms", "claim_to_process_ms", "submit_to_claim_ms"):
        _percentiles_sane(report[name])
    # one clock for both ends: the process cannot start before its claim
    assert report["claim_to_process_ms"]["p50"] >= report["overhead_ms"]["p50"] > 0
    assert report["target_met"] in (True, False)


def test_scale_module_runs_as_a_program(server_dsn: str) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetq_bench.scale",
            "--dsn",
            server_dsn,
            "--runners",
            "2",
            "--jobs",
            "40",
            "--warmup",
            "0",
            "--idle-seconds",
            "0",
            "--history",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["steps"][0]["succeeded"] == 40
    assert report["idle"] is None and "history" not in report


def test_too_few_connections_fail_before_anything_runs(server_dsn: str) -> None:
    args = _args(scale.add_arguments, ["--runners", "100000", "--history", "0"])
    with pytest.raises(Exception, match="more connections"):
        scale.run(server_dsn, args)
