"""`fleetq bench`: a quick throughput and latency probe with no-op handler jobs.

It runs in a scratch database of its own on the selected server (created, migrated and
dropped), starts real `fleetq-runner` processes, and reads every figure back from
database time (claimed_at, finished_at), so the probe measures the queue, not the
probe. Two phases:

1. throughput: N jobs enqueued in one bulk submit while the runners wait (its rate is
   `enqueue_jobs_per_s`), then drained; jobs/s = N / (last outcome - first claim);
2. latency: jobs submitted one by one at a steady rate to idle runners; enqueue -> start
   percentiles twice: on the producer's clock (from just before the submit call to the
   handler's first line, what a user waits: the submit's commit, the wake-up, the claim
   and the handler's start included), and from the database's timestamps (created_at to
   claimed_at, which leaves those out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fleetq.cli.common import Commands, positive_arg
from fleetq.core import config, migrate, queries
from fleetq.core.db import connect, resolve_dsn
from fleetq.core.driver import AsyncpgDriver, Driver
from fleetq.core.errors import FleetqError

BENCH_CONFIG = """
[settings]
lease_seconds = 30
[lanes.bench]
[projects.bench]
repository = "/dev/null"
[projects.bench.operations.noop]
lane = "bench"
handler = "fleetq.runner.handlers:noop"
timeout_seconds = 60
[projects.bench.operations.stamp]
lane = "bench"
handler = "fleetq.runner.handlers:stamp"
timeout_seconds = 60
"""


def register(commands: Commands) -> None:
    """Add `bench`."""
    p = commands.add_parser(
        "bench",
        help="measure throughput and enqueue->start latency with no-op jobs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--jobs", type=positive_arg, default=5000, help="jobs in the throughput phase")
    p.add_argument("--runners", type=positive_arg, default=4, help="runner processes")
    p.add_argument("--slots", type=positive_arg, default=512, help="bench-lane slots per runner")
    p.add_argument("--batch", type=positive_arg, default=256, help="claim batch per runner")
    p.add_argument("--warmup", type=int, default=1000, help="uncounted jobs run first")
    p.add_argument("--rate", type=float, default=200.0, help="jobs/s in the latency phase")
    p.add_argument("--latency-seconds", type=float, default=5.0, help="latency phase length")
    p.add_argument(
        "--idle-seconds",
        type=float,
        default=10.0,
        help="how long to watch the idle runners' load on the database (0: skip)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="give up after this long")
    p.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    with (
        migrate.scratch_database(resolve_dsn(args.dsn), "fleetq_bench") as dsn,
        tempfile.TemporaryDirectory(prefix="fleetq-bench-") as tmp,
    ):
        path = Path(tmp) / "bench.toml"
        path.write_text(BENCH_CONFIG)
        with connect(dsn) as conn:
            config.apply(conn, config.load(path), source=path)
        report = asyncio.run(_measure(args, dsn, Path(tmp)))
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


async def _measure(args: argparse.Namespace, dsn: str, work: Path) -> dict[str, Any]:
    driver = await AsyncpgDriver.connect(dsn)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # Runners first, so the measured window holds no start-up: the jobs appear at
        # once when the enqueue commits, and every runner is already listening.
        procs = [_start_runner(dsn, i, args, work) for i in range(args.runners)]
        await _until(
            lambda: _count(driver, "bench_registered", "n", args.runners),
            args.timeout,
            "runners to register",
            procs,
        )
        idle = await _idle_phase(driver, args) if args.idle_seconds > 0 else None
        # A warm-up round, not counted: every runner connection compiles the protocol's
        # functions and prepares its statements once, which a short run would measure.
        await driver.fetch(queries.sql("bench_enqueue"), args.warmup, timeout=args.timeout)
        await _until(
            lambda: _count(driver, "bench_progress", "open", 0),
            args.timeout,
            "the warm-up to finish",
            procs,
        )
        first = await _last_id(driver) + 1
        t0 = time.monotonic()
        await driver.fetch(queries.sql("bench_enqueue"), args.jobs, timeout=args.timeout)
        enqueue_s = time.monotonic() - t0
        await _until(
            lambda: _count(driver, "bench_progress", "open", 0),
            args.timeout,
            "the throughput phase to finish",
            procs,
        )
        (row,) = await driver.fetch(queries.sql("bench_throughput"), first)
        seconds = float(row["seconds"] or 0)
        throughput = {
            "jobs": int(row["jobs"]),
            "succeeded": int(row["succeeded"]),
            "seconds": round(seconds, 3),
            "enqueue_seconds": round(enqueue_s, 3),
            "enqueue_jobs_per_s": round(args.jobs / enqueue_s) if enqueue_s else None,
            "jobs_per_s": round(int(row["jobs"]) / seconds) if seconds else None,
        }
        latency = await _latency_phase(driver, args)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        await driver.close()
    return {
        "runners": args.runners,
        "warmup_jobs": args.warmup,
        "slots": args.slots,
        "batch": args.batch,
        "cpus": os.cpu_count(),
        "idle": idle,
        "throughput": throughput,
        "latency": latency,
    }


# A backend that goes idle may hold its statistics up to 10 s before flushing them
# (PGSTAT_IDLE_INTERVAL): the idle window opens only after that, or it would count what
# the runners did before it.
STATS_SETTLE_S = 11.0


async def _idle_phase(driver: Driver, args: argparse.Namespace) -> dict[str, Any]:
    """The idle runners' load: transactions on the bench's database per runner and
    second, with nothing queued (cumulative statistics, read before and after)."""
    await asyncio.sleep(STATS_SETTLE_S)  # see STATS_SETTLE_S; not a synchronisation
    (before,) = await driver.fetch(queries.sql("bench_transactions"))
    t0 = time.monotonic()
    await asyncio.sleep(args.idle_seconds)  # the window being measured
    (after,) = await driver.fetch(queries.sql("bench_transactions"))
    seconds = time.monotonic() - t0
    ours = 1  # the first read's own transaction
    spent = int(after["n"]) - int(before["n"]) - ours
    return {
        "seconds": round(seconds, 1),
        "transactions_per_runner_s": round(spent / seconds / args.runners, 2),
    }


async def _latency_phase(driver: Driver, args: argparse.Namespace) -> dict[str, Any]:
    first = await _last_id(driver) + 1
    total = max(1, int(args.rate * args.latency_seconds))
    start = time.monotonic()
    for i in range(total):
        delay = start + i / args.rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)  # pacing the producer, not synchronising
        await driver.fetch(queries.sql("bench_submit_one"), json.dumps({"t0": time.time()}))
    await _until(
        lambda: _count(driver, "bench_progress", "open", 0),
        args.timeout,
        "the latency phase to finish",
    )
    (row,) = await driver.fetch(queries.sql("bench_latency"), first)
    (producer,) = await driver.fetch(queries.sql("bench_producer_latency"), first)
    return {
        "rate_per_s": args.rate,
        "jobs": int(row["jobs"]),
        "enqueue_to_start_ms": _percentiles(producer["ms"]),
        "database_created_to_claimed_ms": _percentiles(row["ms"]),
    }


def _percentiles(ms: list[float] | None) -> dict[str, float | None]:
    """p50, p95, p99 as `percentile_cont` answered them (None: no job measured)."""
    values: list[float | None] = list(ms) if ms else [None, None, None]
    return {
        name: None if v is None else round(float(v), 2)
        for name, v in zip(("p50", "p95", "p99"), values, strict=True)
    }


def _start_runner(
    dsn: str, i: int, args: argparse.Namespace, work: Path
) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "fleetq.runner",
        "--dsn",
        dsn,
        "--node",
        f"bench{i}",
        "--lane",
        f"bench={args.slots}",
        "--batch",
        str(args.batch),
        "--poll",
        "0.5",
        "--work-dir",
        str(work),
        "--grace",
        "1",
    ]
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=open(work / f"runner{i}.log", "wb")
    )


async def _last_id(driver: Driver) -> int:
    (row,) = await driver.fetch(queries.sql("bench_last_id"))
    return int(row["id"])


async def _count(driver: Driver, query: str, column: str, target: int) -> bool:
    (row,) = await driver.fetch(queries.sql(query))
    return int(row[column]) == target


async def _until(
    check: Any, timeout: float, what: str, procs: list[subprocess.Popen[bytes]] | None = None
) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if await check():
            return
        for proc in procs or []:
            if proc.poll() is not None:
                raise FleetqError(
                    f"bench: a runner exited ({proc.returncode}) while waiting "
                    f"for {what}; see its log in the bench work directory"
                )
        await asyncio.sleep(0.05)  # polling a database condition with a deadline
    raise FleetqError(f"bench: timed out waiting for {what}")
