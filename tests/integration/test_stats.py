"""Overlap windows and fleet figures, from rows put in place by hand."""

from __future__ import annotations

import uuid

from fleetq.core import stats
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver
from fleetq.core.models import JobId
from tests import factories


def _execution(
    conn: SyncConnection,
    job: int,
    token: int,
    runner: str,
    start: str,
    end: str | None,
    *,
    confirmed: bool = False,
    exit_code: int | None = None,
    measured: bool = False,
) -> None:
    conn.execute(
        "INSERT INTO fleetq.executions (job_id, lease_version, runner_id, node, run_id, "
        "launched_at, ended_at, stop_confirmed, exit_code, end_measured) VALUES ($1, $2, $3, "
        "'n', $4, timestamptz '2026-01-01 10:00:00+00' + $5::interval, "
        "timestamptz '2026-01-01 10:00:00+00' + $6::interval, $7, $8, $9)",
        [job, token, runner, uuid.uuid4(), start, end, confirmed, exit_code, measured],
    )


async def test_overlap_windows(driver: Driver, sync_conn: SyncConnection) -> None:
    a = factories.runner(sync_conn, "n", "a")
    b = factories.runner(sync_conn, "n", "b")
    closed = factories.job(sync_conn, state="succeeded")
    _execution(sync_conn, closed, 1, a, "0 s", "30 s", confirmed=True)  # stopped as superseded
    _execution(sync_conn, closed, 2, b, "20 s", "60 s", exit_code=0)
    still_open = factories.job(sync_conn, state="running", owner=b, lease_version=2)
    _execution(sync_conn, still_open, 1, a, "0 s", None)  # a zombie nobody stopped
    _execution(sync_conn, still_open, 2, b, "5 s", None)
    measured = factories.job(sync_conn, state="succeeded")
    _execution(sync_conn, measured, 1, a, "0 s", "25 s", confirmed=True, measured=True)
    _execution(sync_conn, measured, 2, b, "20 s", "60 s", exit_code=0, measured=True)
    # a killed runner's run, closed by its successor's collection long after it really
    # ended (bounded), "outlives" a newer run whose own end was measured: the window
    # exists only because of the bounded end, so it is bounded too
    killed = factories.job(sync_conn, state="succeeded")
    _execution(sync_conn, killed, 1, a, "0 s", "30 s", confirmed=True)
    _execution(sync_conn, killed, 2, b, "20 s", "25 s", exit_code=0, measured=True)
    # the older run's end is measured and comes first, but the newer run was killed with
    # its runner (bounded end, recorded later): it may have died before the older ended
    newer_killed = factories.job(sync_conn, state="succeeded")
    _execution(sync_conn, newer_killed, 1, a, "0 s", "25 s", confirmed=True, measured=True)
    _execution(sync_conn, newer_killed, 2, b, "20 s", "40 s", confirmed=True)
    # a killed runner's run nobody has closed yet (no end recorded), and a newer run that
    # ended, measured: the older one may have died before the newer started (found in
    # the demo: kill -9 of a runner showed an 8.1 s "measured" window), so bounded
    gone = factories.job(sync_conn, state="succeeded")
    _execution(sync_conn, gone, 1, a, "0 s", None)
    _execution(sync_conn, gone, 2, b, "20 s", "28 s", exit_code=0, measured=True)
    apart = factories.job(sync_conn, state="succeeded")
    _execution(sync_conn, apart, 1, a, "0 s", "10 s", confirmed=True)
    _execution(sync_conn, apart, 2, b, "10 s", "20 s", exit_code=0)  # touching is not overlap

    found: dict[int, stats.Overlap] = {o.job_id: o for o in await stats.overlaps(driver)}
    assert set(found) == {closed, still_open, measured, killed, newer_killed, gone}
    assert not found[gone].end_measured and not found[gone].happened
    assert "no end recorded" in found[gone].unseen()
    # an end recorded late (say, after a partition) only bounds the window from above
    assert not found[closed].end_measured and found[measured].end_measured
    assert not found[killed].end_measured and not found[newer_killed].end_measured
    window = found[closed]
    assert (window.older_token, window.newer_token, window.open, window.end_confirmed) == (
        1,
        2,
        False,
        True,
    )
    assert window.ended_at is not None
    assert window.seconds(window.ended_at) == 10.0
    assert found[still_open].open and not found[still_open].end_confirmed
    assert [o.job_id for o in await stats.overlaps(driver, open_only=True)] == [still_open]
    assert [o.job_id for o in await stats.overlaps(driver, job_id=JobId(closed))] == [closed]
    figures = await stats.stats(driver)
    # the two bounded windows may never have happened: counted apart, as possible
    assert not found[killed].happened and found[measured].happened and found[still_open].happened
    assert (
        figures.duplicate_execution_incidents,
        figures.open_overlaps,
        figures.possible_overlaps,
    ) == (2, 1, 4)


async def test_stats_for_one_project(driver: Driver, sync_conn: SyncConnection) -> None:
    """`fleetq stats --project P` (issue 14): the same figures over one project's jobs."""
    a = factories.runner(sync_conn, "n", "a")
    b = factories.runner(sync_conn, "n", "b")
    web = factories.job(sync_conn, state="succeeded")  # webapp
    _execution(sync_conn, web, 1, a, "0 s", "30 s", confirmed=True, measured=True)
    _execution(sync_conn, web, 2, b, "20 s", "60 s", exit_code=0, measured=True)
    tools = factories.job(sync_conn, op=factories.operation(sync_conn, "tools", "lint"))
    everything = await stats.stats(driver)
    assert everything.duplicate_execution_incidents == 1 and sum(everything.states.values()) == 2
    only_tools = await stats.stats(driver, project="tools")
    assert only_tools.duplicate_execution_incidents == 0 and only_tools.states == {"queued": 1}
    only_web = await stats.stats(driver, project="webapp")
    assert only_web.duplicate_execution_incidents == 1 and only_web.states == {"succeeded": 1}
    assert tools != web
