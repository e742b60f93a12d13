"""Every read the console makes, straight through its source on the scenario, without
drawing a screen: what differs between server versions is SQL, so CI's PostgreSQL 15
pass runs this (the views' screens are tested on the embedded server, test_views)."""

from __future__ import annotations

from fleetq.console.source import Source
from fleetq.core.models import JobId
from fleetq.core.views import JobFilter
from tests.console import scenario


async def test_every_console_read_answers_on_the_scenario(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, ids = fleet
    source = Source(dsn, clock=scenario.CLOCK)
    await source.open()
    try:
        at = await source.now()
        assert at == scenario.CLOCK
        overview = await source.overview(at)
        assert [lane.lane for lane in overview.lanes] == ["checks", "control"]
        assert {r.id for r in overview.runners} >= {"old-1/r1", "build-1/r1"}
        page = await source.page(JobFilter(), at)
        assert {j.id for j in page.jobs} >= set(ids.values()) and page.total >= len(ids)
        assert (await source.page(JobFilter(word=str(ids["overlap"])), at)).jobs[0].id == 2
        overlaps = await source.overlaps()
        assert [(o.job_id, o.older_token, o.newer_token) for o in overlaps] == [(2, 1, 2)]
        detail = await source.detail(JobId(ids["unplaceable"]), at)
        assert detail.job.id == ids["unplaceable"] and detail.explanation is not None
        overlap = await source.detail(JobId(ids["overlap"]), at)
        assert overlap.overlaps and len(overlap.executions) == 2
        assert await source.schedules(at)
        events = await source.events(None, 500)
        assert events and await source.events(events[-1].id, 500) == []
        assert await source.drain_preview("build-1/r1") is not None
    finally:
        await source.close()
