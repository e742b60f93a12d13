"""Shipping a command job's output to the database while it runs, so `fleetq logs
--follow` works from any machine. The job writes to its log file (never a pipe: a job
must not block on the runner); this reads what is new every half second and appends it
in chunks, numbered per (job, token), each saying where in the output it starts. A
failed append is tried again at the next tick (the chunk number makes a retry
harmless); shipping never holds the job up, and a run that ends ships what is left, to
its last byte, before its outcome is written.

What is stored is the run's head (its first `HEAD_BYTES`: what ran, how it began) and
its newest bytes within the database's budget (`output_keep_kib`, which every append
answers). A shipper behind by more than the budget skips to the newest budget's worth,
since the database would drop what lies before it anyway: a job writing faster than
shipping goes still ends with its last lines stored. The log file keeps everything.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from fleetq.core import output
from fleetq.core.driver import Driver
from fleetq.core.models import Claim, RunnerId
from fleetq.runner.loops import environmental, wait_or

log = logging.getLogger(__name__)
SHIP_EVERY_S = 0.5
FINAL_TRIES = 3  # failed appends after the run ended before the rest stays in the file
READ_BYTES = 16 * output.CHUNK_BYTES  # at most 1 MiB a tick


class Shipper:
    """Ships one run's log file."""

    def __init__(self, driver: Driver, runner: RunnerId, claim: Claim, path: Path) -> None:
        self.driver, self.runner, self.claim, self.path = driver, runner, claim, path
        self.offset = 0  # the output's bytes before this have been shipped or skipped
        self.seq = 0  # the next chunk's number
        self.keep = output.DEFAULT_KEEP_BYTES  # the database's budget, as last answered
        self.caught_up = False  # the last ship reached the end of the file

    async def run(self, done: asyncio.Event) -> None:
        """Ship every tick until `done`, then the rest, to the end of the file."""
        while not done.is_set():
            await wait_or(done, SHIP_EVERY_S)
            await self.ship()
        failures = 0
        while failures < FINAL_TRIES:
            if not await self.ship():
                failures += 1
            elif self.caught_up:
                return

    async def ship(self) -> bool:
        """Append what is new; False when the database refused or was out of reach (the
        bytes are sent again next time)."""
        data, size = await asyncio.to_thread(self._read_new)
        for start in range(0, len(data), output.CHUNK_BYTES):
            chunk = data[start : start + output.CHUNK_BYTES]
            try:
                self.keep = await output.append(
                    self.driver,
                    runner=self.runner,
                    job_id=self.claim.job_id,
                    token=self.claim.lease_version,
                    seq=self.seq,
                    start=self.offset,
                    data=chunk,
                )
            except Exception as exc:
                if environmental(exc) is None:
                    raise
                log.debug("output of job=%d not shipped yet: %s", self.claim.job_id, exc)
                self.caught_up = False
                return False
            self.offset += len(chunk)
            self.seq += 1
        self.caught_up = self.offset >= size
        return True

    def _read_new(self) -> tuple[bytes, int]:
        """What to ship next, and the file's size when read. The head is read alone, so
        the skip ahead applies right after it."""
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self.offset = skip_to(self.offset, size, self.keep)
                f.seek(self.offset)
                head_left = output.HEAD_BYTES - self.offset
                return f.read(head_left if head_left > 0 else READ_BYTES), size
        except FileNotFoundError:
            return b"", 0


def skip_to(offset: int, size: int, keep: int) -> int:
    """Where shipping goes on from: past the head, behind by more than the budget, at the
    newest budget's worth (the database would drop the rest)."""
    if offset >= output.HEAD_BYTES and size - offset > keep:
        return size - keep
    return offset
