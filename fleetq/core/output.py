"""A job's output in the database, appended by the runner as the job runs (`fleetq logs`
reads and follows it, woken by NOTIFY fleetq_output)."""

from __future__ import annotations

from fleetq.core import queries
from fleetq.core.driver import Driver
from fleetq.core.models import FencingToken, JobId, RunnerId

CHUNK_BYTES = 65536  # the largest chunk the database takes


async def append(
    driver: Driver, *, runner: RunnerId, job_id: JobId, token: FencingToken, seq: int, data: bytes
) -> None:
    """Store chunk `seq` of this run's output (a retry of the same chunk is harmless)."""
    await driver.fetch(queries.sql("output_append"), runner, job_id, token, seq, data)
