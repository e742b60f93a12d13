"""The simulated runner speaks the real protocol: what it claims it starts and finishes,
under its fencing token, and the benchmark reads its figures back."""

from __future__ import annotations

from pathlib import Path

from fleetq.core import producer
from fleetq.core.driver import AsyncpgDriver, Driver
from fleetq_bench import harness, history, scale
from fleetq_bench.simrunner import Cadence, Serving, start_fleet
from fleetq_bench.sql import SQL

FAST = Cadence(poll_s=0.05, poll_max_s=0.2, reap_s=0.5, ping_s=0.5)


async def _fleet_db(db_dsn: str, tmp_path: Path) -> Driver:
    harness.apply_config(db_dsn, scale.CONFIG, tmp_path)
    return await AsyncpgDriver.connect(db_dsn)


async def _drain(observer: Driver, serving: Serving, jobs: int) -> None:
    await producer.submit_many(observer, [scale.SPEC] * jobs, submitted_by="bench")

    async def drained() -> bool:
        return not await harness.queue_open(observer)

    await harness.wait_until(drained, timeout=60, what="the jobs", alive=serving.alive)


async def test_a_simulated_fleet_drains_a_burst(db_dsn: str, tmp_path: Path) -> None:
    observer = await _fleet_db(db_dsn, tmp_path)
    try:
        fleet_ = await start_fleet(db_dsn, 2, prefix="t", lane=scale.LANE, slots=3, cadence=FAST)
        async with Serving(fleet_) as serving:
            await _drain(observer, serving, 40)
            claims, refills = serving.claims(), serving.refills()
            stale, _races = serving.stale()
        (row,) = await observer.fetch(SQL.sql("bench_scale_drain"), 1)
        states = await observer.fetch(
            "SELECT r.id, r.state, l.slots_used FROM fleetq.runners r "
            "JOIN fleetq.runner_lanes l ON l.runner_id = r.id ORDER BY r.id"
        )
        (events,) = await observer.fetch(
            "SELECT count(*) FILTER (WHERE kind = 'started') AS started, "
            "count(*) FILTER (WHERE kind = 'succeeded') AS succeeded FROM fleetq.events"
        )
    finally:
        await observer.close()
    assert row["jobs"] == row["succeeded"] == 40
    assert stale == 0
    assert sum(n for _, n in claims + refills) == 40 and all(s > 0 for s, _ in claims)
    # as the runner does, outcomes carry the claim for the room they free
    assert any(n for _, n in refills), refills
    # they said offline on the way out, and gave every slot back
    assert [(r["id"], r["state"], r["slots_used"]) for r in states] == [
        ("t0/runner", "offline", 0),
        ("t1/runner", "offline", 0),
    ]
    assert events == {"started": 40, "succeeded": 40}


async def test_without_listen_polls_find_the_work(db_dsn: str, tmp_path: Path) -> None:
    observer = await _fleet_db(db_dsn, tmp_path)
    try:
        fleet_ = await start_fleet(
            db_dsn, 1, prefix="q", lane=scale.LANE, slots=2, cadence=FAST, listen=False
        )
        async with Serving(fleet_) as serving:
            await _drain(observer, serving, 5)
            assert serving.stale()[0] == 0
    finally:
        await observer.close()


async def test_the_explained_claim_takes_nothing(db_dsn: str, tmp_path: Path) -> None:
    observer = await _fleet_db(db_dsn, tmp_path)
    try:
        (runner,) = await start_fleet(db_dsn, 1, prefix="x", lane=scale.LANE, slots=4)
        await producer.submit_many(observer, [scale.SPEC] * 10, submitted_by="bench")
        explained = await history.explain_claims(db_dsn, runner.runner, scale.LANE)
        (row,) = await observer.fetch(
            "SELECT count(*) FILTER (WHERE state = 'queued') AS queued, "
            "max(lease_version) AS version FROM fleetq.jobs"
        )
        await runner.close()
    finally:
        await observer.close()
    assert explained is not None  # the test server's login is a superuser
    assert explained["shared_hit"] >= explained["candidates_shared_hit"] > 0
    assert "jobs_queued" in explained["candidates_indexes"]
    assert row == {"queued": 10, "version": 0}  # every explained claim was rolled back


async def test_the_connection_budget_reads_the_server(db_dsn: str) -> None:
    observer = await AsyncpgDriver.connect(db_dsn)
    try:
        found = await harness.require_connections(observer, 1, what="one runner")
    finally:
        await observer.close()
    assert found["max_connections"] > found["reserved"] >= 0
    assert found["in_use"] >= 1 and found["version"]
