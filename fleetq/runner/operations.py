"""The operations this runner launches, read from the database once and kept until the
fleet's configuration changes (`Operations.forget`, on a `config` notice)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fleetq.core import queries
from fleetq.core.driver import Driver
from fleetq.runner import executor, provenance
from fleetq.runner.execution import Operation

Key = tuple[str, str]  # (project, operation)


class Operations:
    """A cache of every operation, filled by one read that every miss meanwhile shares."""

    def __init__(self, driver: Callable[[], Driver]) -> None:
        self._driver = driver  # asked at each read: the pool is made after start-up begins
        self._known: dict[Key, Operation] = {}
        self._reading: asyncio.Future[dict[Key, Operation]] | None = None

    def forget(self) -> None:
        """The configuration changed: read again at the next launch."""
        self._known = {}
        self._reading = None  # a read begun before the change is not reused

    async def get(self, project: str, name: str) -> Operation | None:
        """`project`'s operation `name`, or None if the database has none such."""
        if (project, name) in self._known:
            return self._known[(project, name)]
        # one read for every job that misses at once (a first batch of 256 jobs made
        # 256 reads); a read that failed is not shared with the next miss
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(self._read())
        reading = self._reading
        read = await asyncio.shield(reading)
        if reading is self._reading:  # not one that predates a change
            self._known = read
        return read.get((project, name))

    async def _read(self) -> dict[Key, Operation]:
        rows = await self._driver().fetch(queries.sql("lease_operations"))
        return {
            (r["project"], r["operation"]): Operation(
                command=r["command"],
                handler=r["handler"],
                timeout_s=r["timeout_s"],
                repository=r["repository"],
                limits=executor.Limits.model_validate(r["limits"] or {}),
                evidence=provenance.Evidence.model_validate(r["evidence"] or {}),
            )
            for r in rows
        }
