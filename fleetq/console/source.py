"""The console's database: a small asyncpg pool for reads and actions, and its clock.

Reads go through `fleetq.core.views` and actions through `fleetq.core` (producer, fleet),
so the console writes exactly what `fleetq cancel` and `fleetq drain` write, and runners
observe it the same way. A pinned clock (`clock=`) makes every screen deterministic for
snapshot tests.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg

from fleetq.core import eligibility, fleet, migrate, producer, readers, views
from fleetq.core.db import as_uri
from fleetq.core.driver import AsyncpgDriver, mapped_errors, prepare_asyncpg
from fleetq.core.models import CancelResult, Event, JobId, JobState, RunnerState
from fleetq.core.views import JobDetail, JobFilter, JobPage, Overview

PAGE = 500  # jobs listed at once; the filter narrows beyond that


class Source:
    """Everything the console reads and writes."""

    def __init__(self, dsn: str, *, clock: datetime | None = None) -> None:
        self.dsn = dsn
        self.clock = clock
        self._pool: asyncpg.Pool | None = None
        self.driver: AsyncpgDriver | None = None

    async def open(self) -> None:
        """Connect and check the schema is the one this code speaks."""
        with mapped_errors():
            self._pool = await asyncpg.create_pool(
                as_uri(self.dsn),
                min_size=1,
                max_size=3,
                init=prepare_asyncpg,
                timeout=10,
                server_settings={"application_name": "fleetq-console"},
            )
        self.driver = AsyncpgDriver(self._pool)
        await migrate.require_current_async(self.driver)

    async def close(self) -> None:
        """Close the pool (never raises)."""
        if self.driver is not None:
            await self.driver.close()

    @property
    def _db(self) -> AsyncpgDriver:
        if self.driver is None:
            raise RuntimeError("Source.open() first")
        return self.driver

    async def now(self) -> datetime:
        """The database's clock, or the pinned one."""
        return self.clock or await views.now(self._db)

    async def overview(self, at: datetime) -> Overview:
        """The overview, lanes and runners."""
        return await views.overview(self._db, at=at)

    async def page(self, where: JobFilter, at: datetime) -> JobPage:
        """The jobs view's page."""
        return await views.job_page(self._db, where, limit=PAGE, at=at)

    async def detail(self, job_id: JobId, at: datetime) -> JobDetail:
        """The job detail view."""
        return await views.job_detail(self._db, job_id, at=at)

    async def events(self, after: int | None, limit: int = 500) -> list[Event]:
        """New events after an id (or the newest `limit` on first load)."""
        return await readers.events(self._db, after=after, limit=limit)

    async def cancel(self, job_ids: list[JobId], actor: str) -> list[CancelResult]:
        """Cancel each job, as `fleetq cancel` does."""
        return [
            await producer.cancel(self._db, job_id=j, actor=actor, reason="cancelled in console")
            for j in job_ids
        ]

    async def set_runner_state(
        self, runner: str, state: RunnerState, reason: str, actor: str
    ) -> RunnerState:
        """Drain, pause or resume a runner, as `fleetq drain` does."""
        return await fleet.set_state(
            self._db, runner=runner, state=state, reason=reason, actor=actor
        )

    async def drain_preview(self, runner: str) -> list[tuple[int, str, str]]:
        """For each job a drain of `runner` affects (what it holds, and queued jobs it could
        take), whether another eligible runner with room exists: (job, state, answer)."""
        held = await views.job_page(self._db, JobFilter(runner=runner), limit=50)
        queued = await views.job_page(self._db, JobFilter(state=JobState.QUEUED), limit=200)
        preview: list[tuple[int, str, str]] = []
        for job in held.jobs:
            if job.state.live:
                other = await self._elsewhere(job.id, runner)
                preview.append((job.id, job.state.value, f"finishes here; {other}"))
        for job in queued.jobs:
            explanation = queued.waiting.get(job.id)
            mine = (
                next((v for v in explanation.runners if v.runner_id == runner), None)
                if explanation
                else None
            )
            if mine is None or not (mine.eligible or mine.group == "no capacity now"):
                continue
            others = (
                [v.runner_id for v in explanation.runners if v.eligible and v.runner_id != runner]
                if explanation
                else []
            )
            answer = (
                f"can run on {', '.join(others[:3])}"
                if others
                else "NO other eligible runner with room: it waits"
            )
            preview.append((job.id, job.state.value, answer))
            if len(preview) >= 20:
                break
        return preview

    async def _elsewhere(self, job_id: JobId, runner: str) -> str:
        explanation = await eligibility.explain(self._db, job_id)
        others = [v.runner_id for v in explanation.runners if v.eligible and v.runner_id != runner]
        if others:
            return f"eligible with room elsewhere: {', '.join(others[:3])}"
        return "NO other eligible runner with room now"
