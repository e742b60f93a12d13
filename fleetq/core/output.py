"""A job's output in the database: appended by the runner as the job runs, read by
`fleetq logs` (and followed, woken by NOTIFY fleetq_output) from any machine."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from fleetq.core import queries
from fleetq.core.driver import Driver
from fleetq.core.models import FencingToken, JobId, RunnerId

CHUNK_BYTES = 65536  # the largest chunk the database takes


class Chunk(BaseModel):
    """One piece of one run's output (raw bytes: escape them before showing)."""

    lease_version: int
    seq: int
    at: datetime
    data: bytes


async def append(
    driver: Driver, *, runner: RunnerId, job_id: JobId, token: FencingToken, seq: int, data: bytes
) -> None:
    """Store chunk `seq` of this run's output (a retry of the same chunk is harmless)."""
    await driver.fetch(queries.sql("output_append"), runner, job_id, token, seq, data)


async def read(
    driver: Driver,
    job_id: JobId,
    *,
    token: int | None = None,
    after: tuple[int, int] = (0, -1),
) -> list[Chunk]:
    """Chunks after (token, seq) in order; every token's unless `token` is given."""
    rows = await driver.fetch(queries.sql("output_read"), job_id, token, after[0], after[1])
    return [Chunk.model_validate(r) for r in rows]
