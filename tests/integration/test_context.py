"""A handler's `ctx.transaction()` says "connection lost" (ConnectionFailed) for every
way its connection can fail, so the runner runs it again instead of failing the job:
seen in the fault suite, a PostgreSQL restart made the pool's connect fail and the raw
asyncpg error failed the job (`failed/exception`)."""

from __future__ import annotations

import socket
from datetime import UTC, datetime

import asyncpg
import pytest

from fleetq.core.errors import ConnectionFailed
from fleetq.core.models import Claim, FencingToken, JobId, RunnerId
from fleetq.runner.context import JobContext


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
