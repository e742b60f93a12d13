"""The console's database: a small asyncpg pool for reads and actions, and its clock.

Reads go through `fleetq.core.views` and actions through `fleetq.core` (producer, fleet),
so the console writes exactly what `fleetq cancel` and `fleetq drain` write, and runners
observe it the same way. A pinned clock (`clock=`) makes every screen deterministic for
snapshot tests.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import asyncpg

from fleetq.core import eligibility, fleet, jobpages, migrate, readers, schedules, stats, views
from fleetq.core.db import as_uri
from fleetq.core.driver import (
    AsyncpgDriver,
    connect_each_host,
    mapped_errors,
    prepare_asyncpg,
    server_guard,
)
from fleetq.core.jobpages import JobFilter, JobOrder, JobPage
from fleetq.core.models import CancelResult, Event, JobId, JobState, RunnerState
from fleetq.core.schedules import Listed
from fleetq.core.stats import Overlap
from fleetq.core.views import (
    Access,
    AlertJob,
    Alerts,
    EventQuery,
    Heartbeat,
    JobDetail,
    Overview,
)

PAGE = 500  # jobs listed at once; the filter narrows beyond that
CANCEL_CHUNK = 200  # jobs cancelled per statement (a bulk cancel reports progress between)


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
                connect=connect_each_host,
                min_size=1,
                max_size=3,
                init=prepare_asyncpg,
                setup=server_guard(self.dsn),
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

    async def page(
        self, where: JobFilter, at: datetime, *, order: JobOrder = JobOrder.NEWEST
    ) -> JobPage:
        """The jobs view's page."""
        return await jobpages.job_page(self._db, where, order=order, limit=PAGE, at=at)

    async def detail(self, job_id: JobId, at: datetime) -> JobDetail:
        """The job detail view."""
        return await views.job_detail(self._db, job_id, at=at)

    async def overlaps(self) -> list[Overlap]:
        """Every overlap window, oldest first."""
        return await stats.overlaps(self._db)

    async def schedules(self, at: datetime) -> list[Listed]:
        """Every schedule with its next tick after `at` and its last job, as `fleetq
        schedules` shows them."""
        return await schedules.listed(self._db, at)

    async def pause_schedule(self, name: str, paused: bool, reason: str, actor: str) -> None:
        """Pause (with a reason) or resume a schedule, as `fleetq schedules pause`."""
        await schedules.pause(self._db, name=name, paused=paused, reason=reason, actor=actor)

    async def events(self, after: int | None, limit: int = 500) -> list[Event]:
        """New events after an id (or the newest `limit` on first load)."""
        return await readers.events(self._db, after=after, limit=limit)

    async def cancel(
        self, job_ids: list[JobId], actor: str, progress: Callable[[int], object] = lambda _n: None
    ) -> list[CancelResult]:
        """Cancel the jobs as `fleetq cancel` does, a chunk per statement; `progress` hears
        how many are done after each chunk."""
        results: list[CancelResult] = []
        for start in range(0, len(job_ids), CANCEL_CHUNK):
            chunk = job_ids[start : start + CANCEL_CHUNK]
            results += await views.cancel_many(
                self._db, chunk, actor=actor, reason="cancelled in console"
            )
            progress(len(results))
        return results

    async def access(self) -> Access:
        """What this login may do (a reader may not act)."""
        return await views.access(self._db)

    async def heartbeats(self) -> list[Heartbeat]:
        """The runners' last heartbeats (the 1 s tick of their ages)."""
        return await views.heartbeats(self._db)

    async def job_ids(self, where: JobFilter) -> list[JobId]:
        """Every job matching the filter (mark all that match)."""
        return await jobpages.job_ids(self._db, where)

    async def search_events(self, query: EventQuery, below: int | None, limit: int) -> list[Event]:
        """A page of an incident search, newest first."""
        return await views.search_events(self._db, query, below=below, limit=limit)

    async def runner_hour(self, runner: str, at: datetime) -> list[tuple[str, int, datetime]]:
        """The runner's events of the last hour, counted by kind."""
        return await views.runner_hour(self._db, runner, at - timedelta(hours=1))

    async def alert_jobs(self, alerts: Alerts | None = None) -> list[AlertJob]:
        """The jobs behind the overview's alerts (`alerts`: the overview's, read with them)."""
        return await views.alert_jobs(self._db, alerts)

    async def set_runner_state(
        self, runner: str, state: RunnerState, reason: str, actor: str
    ) -> RunnerState:
        """Drain, pause or resume a runner, as `fleetq drain` does."""
        return await fleet.set_state(
            self._db, runner=runner, state=state, reason=reason, actor=actor
        )

    async def drain_preview(self, runner: str) -> list[tuple[int, str, str]]:
        """For each job a drain of `runner` affects (what it holds, and queued jobs it could
        take), whether another eligible runner with room exists: (job, state, answer).
        One eligibility read for all of them."""
        page = await jobpages.job_page(self._db, JobFilter(runner=runner), limit=50)
        held = [job for job in page.jobs if job.state.live]
        queued = await jobpages.job_page(self._db, JobFilter(state=JobState.QUEUED), limit=200)
        verdicts = {**queued.waiting, **await eligibility.explain_many(self._db, held)}
        preview: list[tuple[int, str, str]] = []
        for job in [*held, *queued.jobs]:
            by_runner = {v.runner_id: v for v in verdicts[job.id].runners}
            others = ", ".join([r for r, v in by_runner.items() if v.eligible and r != runner][:3])
            if job.state.live:
                where = (
                    f"eligible with room elsewhere: {others}"
                    if others
                    else "NO other eligible runner with room now"
                )
                preview.append((job.id, job.state.value, f"finishes here; {where}"))
                continue
            mine = by_runner.get(runner)
            if mine is None or not (mine.eligible or mine.group == "no capacity now"):
                continue  # this runner could not take it anyway
            answer = (
                f"can run on {others}" if others else "NO other eligible runner with room: it waits"
            )
            preview.append((job.id, job.state.value, answer))
            if len(preview) >= 20:
                break
        return preview
