"""A job's output in the database, appended by the runner as the job runs (`fleetq logs`
reads and follows it, woken by NOTIFY fleetq_output)."""

from __future__ import annotations

from pydantic import BaseModel

from fleetq.core import queries
from fleetq.core.driver import Driver
from fleetq.core.models import FencingToken, JobId, RunnerId

CHUNK_BYTES = 65536  # the largest chunk the database takes
HEAD_BYTES = 65536  # a run's first bytes, always kept: what ran, and how it began
DEFAULT_KEEP_BYTES = 1024 * 1024  # output_keep_kib's default, until the database answers


async def append(
    driver: Driver,
    *,
    runner: RunnerId,
    job_id: JobId,
    token: FencingToken,
    seq: int,
    start: int,
    data: bytes,
) -> int:
    """Store chunk `seq` of this run's output, which starts at byte `start` of it (a
    retry of the same chunk is harmless); return the budget the database keeps past the
    run's head, in bytes."""
    rows = await driver.fetch(queries.sql("output_append"), runner, job_id, token, seq, start, data)
    return int(rows[0]["keep_bytes"])


def dropped_marker(dropped: int) -> str:
    """What a reader shows where a run's output lost bytes (between its head and its
    newest bytes, or before its first stored chunk)."""
    return (
        f"── {dropped:,} bytes of output dropped here (a run keeps its first 64 KiB and its "
        "newest output_keep_kib; the log on the runner's node has all of it) ──"
    )


def gap(previous_end: int | None, start: int | None) -> int:
    """Bytes missing between a chunk ending at `previous_end` (None: none read yet, the
    run's start) and the next starting at `start` (None: an older runner's chunk, whose
    place is unknown: nothing is said)."""
    if start is None:
        return 0
    return start - (previous_end or 0)


TAIL_BYTES = 262144  # what the console's live tail reads at most
TAIL_CHUNKS = 64


class RunOutput(BaseModel):
    """The newest output of one run (fencing token) of a job, decoded; untrusted text."""

    token: int
    text: str
    cut: bool  # earlier output of this run exists beyond what was read


async def newest(driver: Driver, job_id: JobId, *, max_bytes: int = TAIL_BYTES) -> list[RunOutput]:
    """The newest output of a job, at most `max_bytes`, by run, oldest run first, with a
    marker line where a run's stored output lost bytes. A cancelled or fenced run keeps
    what it had shipped."""
    rows = await driver.fetch(queries.sql("output_newest"), job_id, TAIL_CHUNKS)
    kept: list[tuple[int, int, int | None, bytes]] = []
    size = 0
    for row in rows:
        data = bytes(row["data"])
        if kept and size + len(data) > max_bytes:
            break
        start = None if row["start_byte"] is None else int(row["start_byte"])
        kept.append((int(row["lease_version"]), int(row["seq"]), start, data))
        size += len(data)
    runs: dict[int, list[tuple[int, int | None, bytes]]] = {}
    for token, seq, start, data in reversed(kept):
        runs.setdefault(token, []).append((seq, start, data))
    return [
        RunOutput(token=token, text=_joined(chunks), cut=chunks[0][0] > 0)
        for token, chunks in runs.items()
    ]


def _joined(chunks: list[tuple[int, int | None, bytes]]) -> str:
    """One run's chunks as text, a marker line between two that are not contiguous (the
    first chunk read is not compared with the run's start: `cut` says that)."""
    parts: list[bytes] = []
    end: int | None = None
    for _, start, data in chunks:
        if end is not None and (missing := gap(end, start)) > 0:
            marker = dropped_marker(missing)
            parts.append(("" if parts[-1].endswith(b"\n") else "\n").encode())
            parts.append(f"{marker}\n".encode())
        parts.append(data)
        end = None if start is None else start + len(data)
    return b"".join(parts).decode("utf-8", errors="replace")
