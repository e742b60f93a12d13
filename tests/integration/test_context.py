"""A handler's `ctx.transaction()` says "connection lost" (ConnectionFailed) for every
way its connection can fail, so the runner runs it again instead of failing the job:
seen in the fault suite, a PostgreSQL restart made the pool's connect fail and the raw
asyncpg error failed the job (`failed/exception`)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from datetime import UTC, datetime

import asyncpg
import pytest

from fleetq.core import leasing, producer
from fleetq.core.db import SyncConnection, as_uri, connect
from fleetq.core.driver import Driver
from fleetq.core.errors import ConnectionFailed, DatabaseBusy
from fleetq.core.models import Claim, FencingToken, JobId, RunnerId
from fleetq.runner import handling
from fleetq.runner.context import JobContext
from tests import fleet
from tests.fleet import SHA


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket is closed


async def test_a_connection_that_cannot_be_made_is_a_lost_connection() -> None:
    pool = await asyncpg.create_pool(
        f"postgresql://postgres@127.0.0.1:{_closed_port()}/x", min_size=0, timeout=2
    )
    claim = Claim(
        job_id=JobId(1),
        lease_version=FencingToken(1),
        lease_expires_at=datetime.now(UTC),
        project="p",
        operation="o",
        commit_sha="0" * 40,
        requested_node=None,
        payload={},
        task_id=None,
        timeout_s=60,
        memory_mb=0,
        cpu_millis=0,
        priority_class=2,
        reassign_count=0,
        lost_count=0,
    )
    ctx = JobContext(claim=claim, runner=RunnerId("n/r"), pool=pool)
    try:
        with pytest.raises(ConnectionFailed, match="could not be made"):
            async with ctx.transaction():
                pass
    finally:
        await pool.close()


async def test_a_lock_not_had_in_time_is_busy_and_runs_again(
    db_dsn: str, sync_conn: SyncConnection, driver: Driver
) -> None:
    """Seen in the fault suite: the job row's lock not had within lock_timeout raised
    asyncpg's own error, and the handler's job failed `exception`. It is DatabaseBusy
    now, which the runner treats as a cut run: run again in place, then handed back."""
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver)
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="a")
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    pool = await asyncpg.create_pool(
        as_uri(db_dsn), min_size=0, server_settings={"lock_timeout": "200"}
    )
    try:
        ctx = JobContext(claim=claim, runner=runner, pool=pool)
        with connect(db_dsn) as holder:  # an operator holds the job's row
            holder.execute("SELECT 1 FROM fleetq.jobs WHERE id = $1 FOR UPDATE", [claim.job_id])
            with pytest.raises(DatabaseBusy):
                async with ctx.transaction():
                    pass

            async def handler(ctx: JobContext) -> None:
                async with ctx.transaction():
                    pass

            finished = await handling.run_handler(handler, ctx, timeout_s=30, stoppable=_Never())
            assert finished.outcome is None and finished.lost is not None
            assert "busy" in finished.lost
    finally:
        await pool.close()


class _Never:
    """Never asked to stop."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()

    def on_stop(self, hook: Callable[[], None]) -> Callable[[], None]:
        return lambda: None
