"""The systems `fleetq-bench` measures, each behind one small `Peer` protocol.

A `System` is one row of the comparison: a queue and the settings its workers run with.
Rows that cap a worker's jobs in flight at the same number (`in_flight_per_worker`)
compare pairwise; `batch` is how many jobs one claim may take. The peers' libraries
(pgqueuer, procrastinate) are imported only when a row of theirs is measured, so a run
of fleetq alone never loads them. The `floor`
rows are no product: the least a durable queue on PostgreSQL does for a job
(`peers/floor.py`), the reference every other row is read against.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any, Protocol

from fleetq.core.errors import FleetqError, InvalidInput

INSTALL_HINT = (
    "it is a dependency of the bench project (bench/pyproject.toml): run the benchmarks "
    "from a checkout of fleetq as `uv run --project bench fleetq-bench ...`"
)


@dataclasses.dataclass(frozen=True)
class System:
    """One row: a queue (`kind`, its adapter module here) and its workers' settings."""

    name: str
    kind: str
    in_flight_per_worker: int | None  # None: the system sets no cap
    batch: int  # jobs one claim may take
    settings: str  # how the workers are configured, in the system's own words


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System(
            "fleetq", "fleetq", 512, 256, "fleetq-bench's defaults: lane slots 512, --batch 256"
        ),
        System("fleetq-cap8", "fleetq", 8, 8, "lane slots 8, --batch 8"),
        System("fleetq-cap32", "fleetq", 32, 32, "lane slots 32, --batch 32"),
        System(
            "pgqueuer-default",
            "pgqueuer",
            None,
            10,
            "QueueManager.run defaults: batch_size 10, max_concurrent_tasks unset",
        ),
        System(
            "pgqueuer-cap8",
            "pgqueuer",
            8,
            4,
            "max_concurrent_tasks 8, batch_size 4 (pgqueuer requires the cap >= 2x batch)",
        ),
        System(
            "pgqueuer-cap32",
            "pgqueuer",
            32,
            16,
            "max_concurrent_tasks 32, batch_size 16 (pgqueuer requires the cap >= 2x batch)",
        ),
        System(
            "procrastinate-c8",
            "procrastinate",
            8,
            1,
            "run_worker_async(concurrency=8, listen_notify=True); pool of 8 connections; "
            "it fetches one job per query",
        ),
        System("floor", "floor", 512, 256, "in flight 512, batch 256 (as fleetq's defaults)"),
        System("floor-cap8", "floor", 8, 8, "in flight 8, batch 8"),
        System("floor-cap32", "floor", 32, 32, "in flight 32, batch 32"),
    )
}


class Row(Protocol):
    """A result row by column name: a dict, an asyncpg Record."""

    def __getitem__(self, key: str, /) -> Any: ...


@dataclasses.dataclass(frozen=True)
class Span:
    """A throughput phase as the system's own tables saw it."""

    jobs: int
    succeeded: int
    seconds: float | None  # first start -> last outcome, database time

    @classmethod
    def of(cls, row: Row) -> Span:
        """From a span query's row (`jobs`, `succeeded`, `seconds`), as every peer's is."""
        seconds = row["seconds"]
        return cls(
            int(row["jobs"]), int(row["succeeded"]), None if seconds is None else float(seconds)
        )


@dataclasses.dataclass(frozen=True)
class Latencies:
    """Enqueue -> start in ms, per job: on the producer's clock, and (fleetq only) from
    the database's own timestamps."""

    producer_ms: list[float]
    database_ms: list[float] | None = None


class Peer(Protocol):
    """What the harness needs of a queue. Every method that talks to the scratch
    database on the harness's behalf makes exactly one call (a statement, a transaction),
    so the harness can book its own work and take it off the counts; `enqueue` and
    `submit` are single statements too."""

    system: System

    async def install(self, dsn: str, work: Path) -> None:
        """Create the system's schema in the fresh scratch database `dsn`."""
        ...

    async def open(self, dsn: str) -> None:
        """Connect the producer."""
        ...

    async def enqueue(self, jobs: int) -> int:
        """Enqueue `jobs` no-op jobs in one bulk call; answer the first one's id."""
        ...

    async def submit(self, t0: float) -> int:
        """Submit one latency job carrying the producer's clock `t0`; answer its id."""
        ...

    def worker_argv(self, dsn: str, index: int, work: Path) -> list[str]:
        """The command line of worker process `index` (its files go in `work`)."""
        ...

    async def ready(self, workers: int, work: Path) -> bool:
        """Whether all `workers` are up and waiting for jobs."""
        ...

    async def drained(self) -> bool:
        """Whether no job is queued or running."""
        ...

    async def span(self, first: int, end: int) -> Span:
        """The jobs with ids from `first` to before `end`, as the system's tables tell."""
        ...

    async def latencies(self, first: int, since: float, work: Path) -> Latencies:
        """Latency samples of the jobs from `first` on submitted at or after `since`."""
        ...

    async def close(self) -> None:
        """Disconnect the producer."""
        ...


def select(names: str) -> list[System]:
    """The systems named in a comma-separated list ("all": every one)."""
    wanted = list(SYSTEMS) if names.strip() == "all" else [n.strip() for n in names.split(",")]
    unknown = [n for n in wanted if n not in SYSTEMS]
    if unknown or not wanted:
        raise InvalidInput(
            f"unknown system(s) {', '.join(unknown) or '(none)'}; known: {', '.join(SYSTEMS)}"
        )
    return [SYSTEMS[n] for n in dict.fromkeys(wanted)]


def load(system: System) -> Peer:
    """The adapter of `system`, its library imported now (and only now)."""
    try:
        module = importlib.import_module(f"fleetq_bench.peers.{system.kind}")
    except ImportError as exc:
        raise FleetqError(
            f"measuring {system.name} needs {exc.name or system.kind}: {INSTALL_HINT}"
        ) from exc
    peer: Peer = module.adapter(system)
    return peer
