"""Every read the console makes, straight through its source on the scenario, without
drawing a screen: what differs between server versions is SQL, so CI's PostgreSQL 15
pass runs this (the views' screens are tested on the embedded server, test_views)."""

from __future__ import annotations

from datetime import timedelta

from fleetq.console.source import Source
from fleetq.console.views.job_cells import SORTS
from fleetq.core.db import connect
from fleetq.core.jobpages import STATE_ORDER, JobFilter, JobOrder
from fleetq.core.models import JobId, JobState
from fleetq.core.views import EventQuery
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
        for order, label, key in SORTS[1:]:  # cut on the server as the view sorts on screen
            assert key is not None
            cut = await source.page(JobFilter(), at, order=order)
            expected = sorted(page.jobs, key=lambda j: key(j, at))
            assert [j.id for j in cut.jobs] == [j.id for j in expected], label
            if order == JobOrder.STATE:  # what runs first, not claimed/cancelled/failed
                assert cut.jobs[0].state == JobState.RUNNING
        assert set(STATE_ORDER) == set(JobState)  # every state has its place
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


async def test_every_incident_read_answers_on_the_scenario(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """The reads behind incident search, a runner's hour, the alerts' jobs, the 1-s
    heartbeat ages, what the login may do and mark-all: on PostgreSQL 15 too."""
    dsn, ids = fleet
    source = Source(dsn, clock=scenario.CLOCK)
    await source.open()
    try:
        at = await source.now()
        access = await source.access()
        assert access.login and access.may_cancel and access.may_steer
        beats = {b.id for b in await source.heartbeats()}
        assert {"old-1/r1", "build-1/r1", "edge-1/r1"} <= beats
        queued = await source.job_ids(JobFilter(word="state:queued"))
        page = await source.page(JobFilter(word="state:queued"), at)
        assert set(queued) >= {j.id for j in page.jobs} and len(queued) == page.total

        overlap = ids["overlap"]
        by_runner = await source.search_events(EventQuery(runner="edge-1/r1"), None, 3)
        assert [e.kind for e in by_runner] == ["stopped", "stale_rejected", "lease_expired"]
        older = await source.search_events(EventQuery(runner="edge-1/r1"), by_runner[-1].id, 3)
        assert [e.kind for e in older] == ["started", "claimed", "runner_draining"]
        by_job = await source.search_events(EventQuery(job=JobId(overlap), kind="claimed"), None, 9)
        assert [e.lease_version for e in by_job] == [2, 1]
        window = EventQuery(
            job=JobId(overlap), since=at - timedelta(seconds=62), until=at - timedelta(seconds=50)
        )
        assert [e.kind for e in await source.search_events(window, None, 9)] == [
            "stale_rejected",
            "started",
            "claimed",
            "lease_expired",
        ]

        hour = {kind: n for kind, n, _ in await source.runner_hour("edge-1/r1", at)}
        assert hour["lease_expired"] == 1 and hour["stale_rejected"] == 1
        assert hour["overlap"] == 1 and "self_fenced" not in hour  # superseded, not fenced
        assert "overlap" not in {k for k, _, _ in await source.runner_hour("gpu-1/r1", at)}
        with connect(dsn, autocommit=True) as conn:  # a runner that could not stop a job
            conn.execute(
                "UPDATE fleetq.runners SET state = 'draining', "
                "state_reason = $1 WHERE id = 'gpu-1/r1'",
                [f"stop-unconfirmed: job {ids['hostile']}"],
            )
        alerts = {(a.job_id, a.alert) for a in await source.alert_jobs()}
        assert (JobId(ids["hostile"]), "stop unconfirmed") in alerts
        assert (JobId(ids["stopping"]), "stop pending") in alerts
        assert (JobId(ids["overlap"]), "overlap") not in alerts  # its older run ended
        assert (JobId(ids["unplaceable"]), "no runner can take it") in alerts
    finally:
        await source.close()
