"""A job's output in the database, appended by the runner as the job runs (`fleetq logs`
reads and follows it, woken by NOTIFY fleetq_output)."""

from __future__ import annotations

from pydantic import BaseModel

from fleetq.core import queries
from fleetq.core.driver import Driver
from fleetq.core.models import FencingToken, JobId, RunnerId

CHUNK_BYTES = 65536  # the largest chunk the database takes


async def append(
    driver: Driver, *, runner: RunnerId, job_id: JobId, token: FencingToken, seq: int, data: bytes
) -> None:
    """Store chunk `seq` of this run's output (a retry of the same chunk is harmless)."""
    await driver.fetch(queries.sql("output_append"), runner, job_id, token, seq, data)


TAIL_BYTES = 262144  # what the console's live tail reads at most
TAIL_CHUNKS = 64


class RunOutput(BaseModel):
    """The newest output of one run (fencing token) of a job, decoded; untrusted text."""

    token: int
    text: str
    cut: bool  # earlier output of this run exists beyond what was read


async def newest(driver: Driver, job_id: JobId, *, max_bytes: int = TAIL_BYTES) -> list[RunOutput]:
    """The newest output of a job, at most `max_bytes`, by run, oldest run first. A
    cancelled or fenced run keeps what it had shipped."""
    rows = await driver.fetch(queries.sql("output_newest"), job_id, TAIL_CHUNKS)
    kept: list[tuple[int, int, bytes]] = []
    size = 0
    for row in rows:
        data = bytes(row["data"])
        if kept and size + len(data) > max_bytes:
            break
        kept.append((int(row["lease_version"]), int(row["seq"]), data))
        size += len(data)
    runs: dict[int, list[tuple[int, bytes]]] = {}
    for token, seq, data in reversed(kept):
        runs.setdefault(token, []).append((seq, data))
    return [
        RunOutput(
            token=token,
            text=b"".join(d for _, d in chunks).decode("utf-8", errors="replace"),
            cut=chunks[0][0] > 0,  # its first chunks were not read, or were dropped
        )
        for token, chunks in runs.items()
    ]
