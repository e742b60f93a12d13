"""Racing claimers on one database: nothing is claimed twice, nothing over-reserved."""

from __future__ import annotations

import asyncio
from collections import Counter

from fleetq.core import fleet as fleet_api
from fleetq.core import leasing, readers
from fleetq.core.db import SyncConnection
from fleetq.core.driver import AsyncpgDriver, Driver
from fleetq.core.models import JobState, Outcome, OutcomeReport, RunnerId
from tests import factories, fleet

CLAIMERS = 8
JOBS = 2000


def _bulk_jobs(conn: SyncConnection, n: int) -> None:
    """Queue n jobs in one statement (the factories' rules, at volume)."""
    factories.operation(conn, "tools", "lint", memory_mb=64, cpu_millis=100)
    conn.execute(
        "INSERT INTO fleetq.jobs (project, operation, commit_sha, lane, memory_mb, cpu_millis, "
        "timeout_s, submitted_by, priority_class) "
        "SELECT 'tools', 'lint', $1, 'checks', 64, 100, 60, 'bench', (i % 3) "
        "FROM generate_series(1, $2) i",
        [factories.SHA, n],
    )


async def _work(
    driver: Driver, runner: RunnerId, seen: list[tuple[int, int]], peaks: list[int]
) -> None:
    """Claim in batches and complete them at once, until the queue stays empty."""
    idle = 0
    while idle < 3:  # an empty answer may be skipped locks: look again before leaving
        claims = await leasing.claim(driver, runner=runner, lane="checks", limit=16)
        if not claims:
            idle += 1
            continue
        idle = 0
        seen.extend((c.job_id, c.lease_version) for c in claims)
        (me,) = [r for r in await fleet_api.runners(driver) if r.id == runner]
        peaks.append(me.lanes["checks"][1])
        assert me.reserved_memory_mb <= me.memory_mb and me.reserved_cpu_millis <= me.cpu_millis
        answers = await leasing.complete_many(
            driver,
            runner=runner,
            outcomes=[
                OutcomeReport(
                    job_id=c.job_id,
                    lease_version=c.lease_version,
                    outcome=Outcome.SUCCEEDED,
                    exit_code=0,
                )
                for c in claims
            ],
        )
        assert {a.status for a in answers} == {"ok"}


async def test_eight_claimers_two_thousand_jobs(
    db_dsn: str, driver: Driver, sync_conn: SyncConnection
) -> None:
    _bulk_jobs(sync_conn, JOBS)
    drivers = [await AsyncpgDriver.connect(db_dsn) for _ in range(CLAIMERS)]
    runners = [
        # tight memory, so the capacity CHECK is exercised, not just the slot count
        await fleet.runner(
            driver,
            f"r{i}",
            node=f"n{i}",
            lanes={"checks": 16},
            memory_mb=64 * 12,
            cpu_millis=100 * 16,
        )
        for i in range(CLAIMERS)
    ]
    seen: list[tuple[int, int]] = []
    peaks: list[int] = []
    try:
        await asyncio.gather(
            *(_work(d, r, seen, peaks) for d, r in zip(drivers, runners, strict=True))
        )
    finally:
        await asyncio.gather(*(d.close() for d in drivers))
    per_job = Counter(job for job, _ in seen)
    assert len(per_job) == JOBS and set(per_job.values()) == {1}  # each exactly once
    assert {token for _, token in seen} == {1}
    assert max(peaks) <= 12  # memory allowed 12 at a time, slots 16
    assert len(await readers.jobs(driver, state=JobState.SUCCEEDED, limit=JOBS + 1)) == JOBS
    assert all(r.reserved_memory_mb == 0 for r in await fleet_api.runners(driver))
    claimers = Counter(
        e.runner_id for e in await readers.events(driver, limit=100_000) if e.kind == "claimed"
    )
    assert len(claimers) > 1, "the claimers did not actually race"
