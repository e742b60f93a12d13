"""The floor as a benchmark row: the least a durable PostgreSQL queue does for a job.

Not a product: a reference, so that fleetq's and its peers' figures can be read against
what this server and this machine allow at all. One table; one statement per step (an
INSERT with a NOTIFY to one worker to enqueue, an UPDATE ... FOR UPDATE SKIP LOCKED to
claim, an UPDATE to record the ends of a batch), each its own durable transaction, as
every peer's are.
Nothing else: no identity check, no event row, no eligibility, no lease or fencing token,
no reservation, no verdict (`bench/fleetq_bench/sql/floor.sql`). Workers are
`python -m fleetq_bench.peers.floor_worker` on asyncpg and asyncio's own event loop, as
fleetq's runner; they need no peer's library.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import asyncpg

from fleetq.core.db import as_uri
from fleetq_bench.counters import SQL
from fleetq_bench.peers import Latencies, Span, System
from fleetq_bench.samples import read_samples, ready_files


class FloorPeer:
    """The adapter (see `fleetq_bench.peers.Peer`)."""

    def __init__(self, system: System) -> None:
        self.system = system
        self._conn: asyncpg.Connection | None = None
        self._workers = 0  # how many worker_argv made: each LISTENs on floor_<index>

    @property
    def conn(self) -> asyncpg.Connection:
        """The producer's connection (after `open`)."""
        assert self._conn is not None, "open() first"
        return self._conn

    async def install(self, dsn: str, work: Path) -> None:
        """The one table and its index."""
        conn = await asyncpg.connect(as_uri(dsn))
        try:
            await conn.execute(SQL.sql("floor_install"))
        finally:
            await conn.close()

    async def open(self, dsn: str) -> None:
        """One asyncpg connection."""
        self._conn = await asyncpg.connect(as_uri(dsn))

    async def enqueue(self, jobs: int) -> int:
        """One INSERT of every job, a NOTIFY to each worker."""
        workers = max(1, self._workers)
        return int(await self.conn.fetchval(SQL.sql("floor_enqueue"), jobs, workers, timeout=300))

    async def submit(self, t0: float) -> int:
        """One job whose payload holds `t0`, and a NOTIFY to one worker."""
        payload = json.dumps({"t0": t0})
        workers = max(1, self._workers)
        return int(await self.conn.fetchval(SQL.sql("floor_submit"), payload, workers))

    def worker_argv(self, dsn: str, index: int, work: Path) -> list[str]:
        """A floor worker with this row's batch and cap, LISTENing on `floor_<index>`."""
        self._workers = max(self._workers, index + 1)
        return [
            sys.executable,
            "-m",
            "fleetq_bench.peers.floor_worker",
            "--dsn",
            dsn,
            "--batch",
            str(self.system.batch),
            "--cap",
            str(self.system.in_flight_per_worker or self.system.batch),
            "--channel",
            f"floor_{index}",
            "--samples",
            str(work / f"samples-{index}.txt"),
            "--ready",
            str(work / f"ready-{index}"),
        ]

    async def ready(self, workers: int, work: Path) -> bool:
        """Every worker wrote its ready file (once it LISTENs)."""
        return await ready_files(work) == workers

    async def drained(self) -> bool:
        """No job queued or picked."""
        return int(await self.conn.fetchval(SQL.sql("floor_open"))) == 0

    async def span(self, first: int, end: int) -> Span:
        """First pick to last end, from the table's own timestamps."""
        row = await self.conn.fetchrow(SQL.sql("floor_span"), first, end)
        assert row is not None
        return Span.of(row)

    async def latencies(self, first: int, since: float, work: Path) -> Latencies:
        """From the workers' sample files."""
        return Latencies(read_samples(work, since))

    async def close(self) -> None:
        """Close the producer's connection."""
        if self._conn is not None:
            await self._conn.close()


def adapter(system: System) -> FloorPeer:
    """The adapter for `system` (a floor row)."""
    return FloorPeer(system)
