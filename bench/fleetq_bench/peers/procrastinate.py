"""procrastinate 3.10 as a benchmark peer: `run_worker_async` processes on psycopg.

The producer defers with procrastinate's own `batch_defer_async` (one statement for all
the jobs). Workers are `python -m fleetq_bench.peers.procrastinate_worker`; the tasks are
`noop` and `stamp`, which writes its `t0` argument and its own clock at its first line
to a file of its process.
"""

from __future__ import annotations

import sys
from pathlib import Path

from procrastinate import App, PsycopgConnector

from fleetq.core.driver import PsycopgDriver
from fleetq_bench.counters import SQL
from fleetq_bench.peers import Latencies, Span, System
from fleetq_bench.samples import read_samples

# Connections each worker's pool keeps: one per job in flight, so a job never waits for a
# connection to fetch or to finish (psycopg_pool's default of 4 would throttle 8).
POOL_PER_WORKER = 8


class ProcrastinatePeer:
    """The adapter (see `fleetq_bench.peers.Peer`)."""

    def __init__(self, system: System) -> None:
        self.system = system
        self._app: App | None = None
        self._reader: PsycopgDriver | None = None

    @property
    def app(self) -> App:
        """The producer's app (after `open`)."""
        assert self._app is not None, "open() first"
        return self._app

    @property
    def reader(self) -> PsycopgDriver:
        """The harness's reads of procrastinate's tables (after `open`)."""
        assert self._reader is not None, "open() first"
        return self._reader

    async def install(self, dsn: str, work: Path) -> None:
        """The schema manager's `apply_schema_async`."""
        async with _app(dsn, 1).open_async() as app:
            await app.schema_manager.apply_schema_async()

    async def open(self, dsn: str) -> None:
        """An app whose pool holds the producer's one connection."""
        self._app = _app(dsn, 1)
        await self._app.open_async()
        self._reader = await PsycopgDriver.connect(dsn)

    async def enqueue(self, jobs: int) -> int:
        """`batch_defer_async`: one statement defers every job."""
        ids = await self.app.configure_task("noop").batch_defer_async(*({} for _ in range(jobs)))
        return min(int(i) for i in ids)

    async def submit(self, t0: float) -> int:
        """`defer_async` of one `stamp` job with `t0` as its argument."""
        return int(await self.app.configure_task("stamp").defer_async(t0=t0))

    def worker_argv(self, dsn: str, index: int, work: Path) -> list[str]:
        """A procrastinate worker process with this row's concurrency."""
        return [
            sys.executable,
            "-m",
            "fleetq_bench.peers.procrastinate_worker",
            "--dsn",
            dsn,
            "--concurrency",
            str(self.system.in_flight_per_worker),
            "--pool",
            str(POOL_PER_WORKER),
            "--samples",
            str(work / f"samples-{index}.txt"),
        ]

    async def ready(self, workers: int, work: Path) -> bool:
        """Every worker registered (each registers as its loop starts)."""
        (row,) = await self.reader.fetch(SQL.sql("procrastinate_workers"))
        return int(row["n"]) == workers

    async def drained(self) -> bool:
        """No job waiting or running."""
        (row,) = await self.reader.fetch(SQL.sql("procrastinate_open"))
        return int(row["open"]) == 0

    async def span(self, first: int, end: int) -> Span:
        """First start to last outcome, from procrastinate's events."""
        (row,) = await self.reader.fetch(SQL.sql("procrastinate_span"), first, end)
        return Span.of(row)

    async def latencies(self, first: int, since: float, work: Path) -> Latencies:
        """From the workers' sample files."""
        return Latencies(read_samples(work, since))

    async def close(self) -> None:
        """Close the app's pool and the reader."""
        if self._app is not None:
            await self._app.close_async()
        if self._reader is not None:
            await self._reader.close()


def _app(dsn: str, pool: int) -> App:
    return App(connector=PsycopgConnector(conninfo=dsn, min_size=pool, max_size=pool))


def adapter(system: System) -> ProcrastinatePeer:
    """The adapter for `system` (a procrastinate row)."""
    return ProcrastinatePeer(system)
