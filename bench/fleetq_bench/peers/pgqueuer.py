"""pgqueuer 1.6 as a benchmark peer: `QueueManager` worker processes on asyncpg.

The producer enqueues with pgqueuer's own `Queries.enqueue`, lists for a bulk insert (one
statement). Workers are `python -m fleetq_bench.peers.pgqueuer_worker`; the handlers are
`noop` and `stamp`, which writes the payload's `t0` and its own clock at its first line
to a file of its process (a database write would add a transaction per sample).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import asyncpg
from pgqueuer.db import AsyncpgDriver
from pgqueuer.queries import Queries

from fleetq.core.db import as_uri
from fleetq_bench.counters import SQL
from fleetq_bench.peers import Latencies, Span, System
from fleetq_bench.samples import read_samples, ready_files


class PgqueuerPeer:
    """The adapter (see `fleetq_bench.peers.Peer`)."""

    def __init__(self, system: System) -> None:
        self.system = system
        self._conn: asyncpg.Connection | None = None

    @property
    def conn(self) -> asyncpg.Connection:
        """The producer's connection (after `open`)."""
        assert self._conn is not None, "open() first"
        return self._conn

    async def install(self, dsn: str, work: Path) -> None:
        """`Queries.install`: pgqueuer's tables (durable, its default), types, trigger."""
        conn = await asyncpg.connect(as_uri(dsn))
        try:
            await Queries(AsyncpgDriver(conn)).install()
        finally:
            await conn.close()

    async def open(self, dsn: str) -> None:
        """One asyncpg connection, as pgqueuer's own producers use."""
        self._conn = await asyncpg.connect(as_uri(dsn))
        self._queries = Queries(AsyncpgDriver(self._conn))

    async def enqueue(self, jobs: int) -> int:
        """`Queries.enqueue` with lists: one INSERT of every job."""
        ids = await self._queries.enqueue(["noop"] * jobs, [None] * jobs, [0] * jobs)
        return min(int(i) for i in ids)

    async def submit(self, t0: float) -> int:
        """`Queries.enqueue` of one `stamp` job whose payload holds `t0`."""
        (job_id,) = await self._queries.enqueue("stamp", json.dumps({"t0": t0}).encode())
        return int(job_id)

    def worker_argv(self, dsn: str, index: int, work: Path) -> list[str]:
        """A pgqueuer worker process with this row's batch and cap."""
        return [
            sys.executable,
            "-m",
            "fleetq_bench.peers.pgqueuer_worker",
            "--dsn",
            dsn,
            "--batch",
            str(self.system.batch),
            "--cap",
            str(self.system.in_flight_per_worker or 0),
            "--samples",
            str(work / f"samples-{index}.txt"),
            "--ready",
            str(work / f"ready-{index}"),
        ]

    async def ready(self, workers: int, work: Path) -> bool:
        """Every worker wrote its ready file (after its listener answered a probe)."""
        return await ready_files(work) == workers

    async def drained(self) -> bool:
        """The queue table is empty (a job leaves it as its outcome is logged)."""
        return int(await self.conn.fetchval(SQL.sql("pgqueuer_open"))) == 0

    async def span(self, first: int, end: int) -> Span:
        """First pick to last outcome, from pgqueuer's log table."""
        row = await self.conn.fetchrow(SQL.sql("pgqueuer_span"), first, end)
        assert row is not None
        return Span.of(row)

    async def latencies(self, first: int, since: float, work: Path) -> Latencies:
        """From the workers' sample files."""
        return Latencies(read_samples(work, since))

    async def close(self) -> None:
        """Close the producer's connection."""
        if self._conn is not None:
            await self._conn.close()


def adapter(system: System) -> PgqueuerPeer:
    """The adapter for `system` (a pgqueuer row)."""
    return PgqueuerPeer(system)
