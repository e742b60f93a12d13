"""What both benchmarks need around their measurements: a configured scratch database,
waiting on a database condition with a deadline, and the server's connection budget."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fleetq.core import config
from fleetq.core.db import connect
from fleetq.core.driver import Driver
from fleetq.core.errors import FleetqError
from fleetq_bench.sql import SQL

POLL_S = 0.05  # how often a wait looks at its condition


class BenchError(FleetqError):
    """A benchmark could not run as asked (the server is too small for it, a part of it
    failed or timed out); the message says what to change."""


def apply_config(dsn: str, text: str, work: Path) -> None:
    """Apply a fleet file (lanes, projects, operations) to the scratch database, with the
    same code as `fleetq apply`."""
    path = work / "fleet.toml"
    path.write_text(text)
    with connect(dsn) as conn:
        config.apply(conn, config.load(path), source=path)


async def wait_until(
    check: Callable[[], Awaitable[bool]],
    *,
    timeout: float,
    what: str,
    alive: Callable[[], None] | None = None,
) -> float:
    """Poll `check` until it is true; returns the seconds waited. `alive` raises when a
    part the wait depends on has failed, so a dead runner is not waited for until the
    deadline. Raises `BenchError` at the deadline."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if await check():
            return time.monotonic() - start
        if alive is not None:
            alive()
        await asyncio.sleep(POLL_S)  # polling a condition, with the deadline above
    raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")


async def queue_open(driver: Driver) -> bool:
    """Whether any job is still queued, claimed or running (two partial-index probes)."""
    (row,) = await driver.fetch(SQL.sql("bench_progress"))
    return bool(row["open"])


async def last_job_id(driver: Driver) -> int:
    """The highest job id so far (0: none), so a phase can name the jobs it submitted."""
    (row,) = await driver.fetch(SQL.sql("bench_last_id"))
    return int(row["id"])


async def require_connections(driver: Driver, needed: int, *, what: str) -> dict[str, Any]:
    """Fail before anything starts when the server cannot give `needed` more connections:
    a benchmark that runs out of connections half way measures nothing. Returns what the
    server said. The reserved superuser slots are not counted on: they are the operator's
    way in when everything else is taken."""
    (row,) = await driver.fetch(SQL.sql("bench_scale_connections"))
    limit, reserved, in_use = (int(row[k]) for k in ("max_connections", "reserved", "in_use"))
    free = limit - reserved - in_use
    if needed > free:
        raise BenchError(
            f"{what} needs {needed} more connections, and the server has {free} free "
            f"(max_connections={limit}, {reserved} reserved for superusers, {in_use} in use). "
            "Raise max_connections (ALTER SYSTEM SET max_connections = ...; it takes a "
            "restart), run against a server of your own, or ask for fewer runners."
        )
    return {
        "version": row["server_version"],
        "max_connections": limit,
        "reserved": reserved,
        "in_use": in_use,
        "free": free,
    }
