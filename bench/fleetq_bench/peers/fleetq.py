"""fleetq itself as a benchmark peer: real `fleetq-runner` processes on a bench lane.

Jobs are the `noop` handler; latency jobs the `stamp` handler, which answers the wall
clock at its first line as the job's log tail. Every figure is read back from fleetq's
own rows (claimed_at, finished_at, the verdicts), so the probe measures the queue.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from fleetq.core import config, migrate
from fleetq.core.db import connect
from fleetq.core.driver import AsyncpgDriver
from fleetq_bench.peers import Latencies, Span, System
from fleetq_bench.sql import SQL

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

# How often an idle runner polls when no notification comes (as `fleetq-bench` always
# ran them); polls that find nothing back off to the runner's --poll-max.
POLL_S = 0.5


class FleetqPeer:
    """The adapter (see `fleetq_bench.peers.Peer`)."""

    def __init__(self, system: System) -> None:
        self.system = system
        self._driver: AsyncpgDriver | None = None

    async def install(self, dsn: str, work: Path) -> None:
        """Migrate, then load the bench's lane, project and operations."""
        await asyncio.to_thread(_install, dsn, work)

    async def open(self, dsn: str) -> None:
        """An asyncpg connection, as the runners use."""
        self._driver = await AsyncpgDriver.connect(dsn)

    @property
    def driver(self) -> AsyncpgDriver:
        """The producer's connection (after `open`)."""
        assert self._driver is not None, "open() first"
        return self._driver

    async def enqueue(self, jobs: int) -> int:
        """One `fleetq.submit_many` of `jobs` no-op jobs."""
        (row,) = await self.driver.fetch(SQL.sql("bench_enqueue"), jobs, timeout=300)
        return int(row["first"])

    async def submit(self, t0: float) -> int:
        """One `fleetq.submit` of a `stamp` job whose payload holds `t0`."""
        (row,) = await self.driver.fetch(SQL.sql("bench_submit_one"), json.dumps({"t0": t0}))
        return int(row["job_id"])

    def worker_argv(self, dsn: str, index: int, work: Path) -> list[str]:
        """`fleetq-runner` serving the bench lane with this row's slots and batch."""
        return [
            sys.executable,
            "-m",
            "fleetq.runner",
            "--dsn",
            dsn,
            "--node",
            f"bench{index}",
            "--lane",
            f"bench={self.system.in_flight_per_worker}",
            "--batch",
            str(self.system.batch),
            "--poll",
            str(POLL_S),
            "--work-dir",
            str(work),
            "--grace",
            "1",
        ]

    async def ready(self, workers: int, work: Path) -> bool:
        """Every runner registered (a runner registers once it can claim)."""
        (row,) = await self.driver.fetch(SQL.sql("bench_registered"))
        return int(row["n"]) == workers

    async def drained(self) -> bool:
        """No job queued, claimed or running."""
        (row,) = await self.driver.fetch(SQL.sql("bench_progress"))
        return int(row["open"]) == 0

    async def span(self, first: int, end: int) -> Span:
        """First claim to last outcome, in database time."""
        (row,) = await self.driver.fetch(SQL.sql("bench_throughput"), first, end)
        return Span.of(row)

    async def latencies(self, first: int, since: float, work: Path) -> Latencies:
        """From the stamp jobs' payloads and log tails, and their rows' timestamps."""
        (producer,) = await self.driver.fetch(SQL.sql("bench_producer_latency"), first)
        (database,) = await self.driver.fetch(SQL.sql("bench_latency"), first)
        return Latencies([float(v) for v in producer["ms"]], [float(v) for v in database["ms"]])

    async def close(self) -> None:
        """Close the producer's connection."""
        if self._driver is not None:
            await self._driver.close()


def _install(dsn: str, work: Path) -> None:
    migrate.migrate(dsn)
    path = work / "bench.toml"
    path.write_text(BENCH_CONFIG)
    with connect(dsn) as conn:
        config.apply(conn, config.load(path), source=path)


def adapter(system: System) -> FleetqPeer:
    """The adapter for `system` (a fleetq row)."""
    return FleetqPeer(system)
