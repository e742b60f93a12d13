"""Shipping a command job's output to the database while it runs, so `fleetq logs
--follow` works from any machine. The job writes to its log file (never a pipe: a job
must not block on the runner); this reads what is new every half second and appends it
in chunks, numbered per (job, token). A failed append is tried again at the next tick
(the chunk number makes a retry harmless); shipping never holds the job up, and a run
that ends ships what is left before its outcome is written."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from fleetq.core import output
from fleetq.core.driver import Driver
from fleetq.core.models import Claim, RunnerId
from fleetq.runner.loops import environmental, wait_or

log = logging.getLogger(__name__)
SHIP_EVERY_S = 0.5
FINAL_TRIES = 3


class Shipper:
    """Ships one run's log file."""

    def __init__(self, driver: Driver, runner: RunnerId, claim: Claim, path: Path) -> None:
        self.driver, self.runner, self.claim, self.path = driver, runner, claim, path
        self.offset = 0  # bytes of the file shipped
        self.seq = 0  # the next chunk's number

    async def run(self, done: asyncio.Event) -> None:
        """Ship every tick until `done`, then what is left."""
        while not done.is_set():
            await wait_or(done, SHIP_EVERY_S)
            await self.ship()
        for _ in range(FINAL_TRIES):
            if await self.ship():
                return

    async def ship(self) -> bool:
        """Append what is new; False when the database refused or was out of reach (the
        bytes are sent again next time)."""
        data = await asyncio.to_thread(self._read_new)
        for start in range(0, len(data), output.CHUNK_BYTES):
            chunk = data[start : start + output.CHUNK_BYTES]
            try:
                await output.append(
                    self.driver,
                    runner=self.runner,
                    job_id=self.claim.job_id,
                    token=self.claim.lease_version,
                    seq=self.seq,
                    data=chunk,
                )
            except Exception as exc:
                if environmental(exc) is None:
                    raise
                log.debug("output of job=%d not shipped yet: %s", self.claim.job_id, exc)
                return False
            self.offset += len(chunk)
            self.seq += 1
        return True

    def _read_new(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                return f.read(16 * output.CHUNK_BYTES)  # at most 1 MiB a tick
        except FileNotFoundError:
            return b""
