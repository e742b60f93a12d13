"""One eligibility rule: what `explain` says is exactly what a claim does."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetq.core import eligibility, leasing, producer, readers
from fleetq.core.db import SyncConnection
from fleetq.core.driver import AsyncpgDriver, Driver
from fleetq.core.models import JobId, RunnerId
from tests import fleet
from tests.fleet import SHA

CAPS = ["browser", "gpu", "linux"]
LANES = ["checks", "control"]


@dataclass(frozen=True)
class RunnerSpec:
    """A runner in any state the rule distinguishes."""

    node: str
    caps: frozenset[str]
    state: str
    stale: bool
    lanes: dict[str, tuple[int, int]]  # lane -> (slots, used)
    memory: int
    reserved_memory: int
    cpu: int
    reserved_cpu: int


@dataclass(frozen=True)
class JobSpec:
    """A queued job's requirements."""

    lane: str
    caps: frozenset[str]
    node: str | None
    memory: int
    cpu: int


@st.composite
def runner_specs(draw: st.DrawFn) -> RunnerSpec:
    memory = draw(st.sampled_from([0, 1024, 4096]))
    cpu = draw(st.sampled_from([0, 1000, 4000]))
    lanes = draw(
        st.dictionaries(
            st.sampled_from(LANES),
            st.integers(1, 2).flatmap(lambda s: st.tuples(st.just(s), st.integers(0, s))),
            max_size=2,
        )
    )
    return RunnerSpec(
        node=draw(st.sampled_from(["n1", "n2"])),
        caps=frozenset(draw(st.sets(st.sampled_from(CAPS)))),
        state=draw(
            st.sampled_from(
                ["active", "active", "active", "paused", "draining", "drained", "offline"]
            )
        ),
        stale=draw(st.integers(0, 4)) == 0,
        lanes=lanes,
        memory=memory,
        reserved_memory=draw(st.integers(0, memory).map(lambda m: m - m % 512)),
        cpu=cpu,
        reserved_cpu=draw(st.integers(0, cpu).map(lambda c: c - c % 500)),
    )


job_specs = st.builds(
    JobSpec,
    lane=st.sampled_from(LANES),
    caps=st.frozensets(st.sampled_from(CAPS), max_size=2),
    node=st.sampled_from([None, None, "n1", "n2"]),
    memory=st.sampled_from([0, 512, 1024, 4096]),
    cpu=st.sampled_from([0, 500, 1000, 4000]),
)


class Rollback(Exception):
    """Raised to undo one example's rows."""


@pytest.fixture
def loop() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as runner:
        yield runner


async def _insert(conn: asyncpg.Connection, runners: list[RunnerSpec], job: JobSpec) -> JobId:
    for i, r in enumerate(runners):
        rid = f"{r.node}/r{i}"
        await conn.execute(
            "INSERT INTO fleetq.runners (id, node, name, capabilities, memory_mb, cpu_millis, "
            "reserved_memory_mb, reserved_cpu_millis, state, last_heartbeat_at) VALUES "
            "($1, $2, $3, $4, $5, $6, $7, $8, $9, clock_timestamp() - "
            "CASE WHEN $10 THEN interval '1 hour' ELSE interval '0' END)",
            rid,
            r.node,
            f"r{i}",
            sorted(r.caps),
            r.memory,
            r.cpu,
            r.reserved_memory,
            r.reserved_cpu,
            r.state,
            r.stale,
        )
        for lane, (slots, used) in r.lanes.items():
            await conn.execute(
                "INSERT INTO fleetq.runner_lanes VALUES ($1, $2, $3, $4)", rid, lane, slots, used
            )
    job_id = await conn.fetchval(
        "INSERT INTO fleetq.jobs (project, operation, commit_sha, lane, capabilities, memory_mb, "
        "cpu_millis, timeout_s, requested_node, submitted_by, priority_class) VALUES "
        "('tools', 'lint', $1, $2, $3, $4, $5, 60, $6, 't', 2) RETURNING id",
        SHA,
        job.lane,
        sorted(job.caps),
        job.memory,
        job.cpu,
        job.node,
    )
    return JobId(int(job_id))


async def _check(driver: AsyncpgDriver, runners: list[RunnerSpec], job: JobSpec) -> None:
    try:
        async with _conn(driver).transaction():
            job_id = await _insert(_conn(driver), runners, job)
            explained = await eligibility.explain(driver, job_id)
            for verdict in explained.runners:
                claimed = await _claim_in_savepoint(driver, RunnerId(verdict.runner_id), job.lane)
                assert claimed == verdict.eligible, (verdict, job)
            counted = sum(n for _, n in explained.counts())
            assert counted + len(explained.eligible) == len(runners), explained.summary()
            raise Rollback
    except Rollback:
        pass


async def _claim_in_savepoint(driver: AsyncpgDriver, runner: RunnerId, lane: str) -> bool:
    try:
        async with _conn(driver).transaction():
            got = await leasing.claim(driver, runner=runner, lane=lane, limit=1)
            raise Rollback if not got else _Claimed
    except _Claimed:
        return True
    except Rollback:
        return False


def _conn(driver: AsyncpgDriver) -> asyncpg.Connection:
    assert isinstance(driver.conn, asyncpg.Connection)
    return driver.conn


class _Claimed(Exception):
    pass


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(runners=st.lists(runner_specs(), min_size=1, max_size=5), job=job_specs)
def test_claim_and_explain_agree(
    db_dsn: str,
    sync_conn: SyncConnection,
    loop: asyncio.Runner,
    runners: list[RunnerSpec],
    job: JobSpec,
) -> None:
    if not _seeded(sync_conn):
        fleet.operations(sync_conn)
    driver = loop.run(AsyncpgDriver.connect(db_dsn))
    try:
        loop.run(_check(driver, runners, job))
    finally:
        loop.run(driver.close())


def _seeded(conn: SyncConnection) -> bool:
    row = conn.execute("SELECT count(*) FROM fleetq.projects").fetchone()
    return bool(row and row[0])


async def test_summary_line_names_reasons_with_counts(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    for i in range(3):
        await fleet.runner(driver, f"plain{i}")
    busy = await fleet.runner(driver, "busy", capabilities=("browser",), memory_mb=8192)
    sync_conn.execute("UPDATE fleetq.runners SET reserved_memory_mb = 6144 WHERE id = $1", [busy])
    small = await fleet.runner(driver, "small", capabilities=("browser",), memory_mb=2048)
    await fleet.runner(driver, "idle", capabilities=("browser",), node="node-b")
    draining = await fleet.runner(driver, "drain", capabilities=("browser",))
    sync_conn.execute("UPDATE fleetq.runners SET state = 'draining' WHERE id = $1", [draining])
    job = await producer.submit(
        driver, project="webapp", operation="browser", commit=SHA, submitted_by="alice"
    )
    explained = await eligibility.explain(driver, job.job_id)
    assert explained.summary() == (
        "1/7 runners eligible: 3 missing capability browser, 1 draining, 1 no capacity now, "
        "1 too small"
    )
    reasons = {v.runner_id: v.describe() for v in explained.runners}
    assert reasons[busy] == "no capacity now: needs 4096 MB, 2048 free"
    assert reasons[small] == "too small: needs 4096 MB, has 2048 MB"
    assert reasons["node-a/plain0"] == "missing capability browser"
    assert explained.eligible == ["node-b/idle"]


async def test_explaining_many_jobs_at_once_agrees_with_one_by_one(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    await fleet.runner(driver, "small", memory_mb=2048, capabilities=("browser",))
    await fleet.runner(driver, "big", node="node-b")
    ids = [
        (await producer.submit(driver, project=p, operation=o, commit=SHA, submitted_by="a")).job_id
        for p, o in [
            ("webapp", "unit"),
            ("webapp", "browser"),
            ("tools", "lint"),
            ("webapp", "unit"),
        ]
    ]
    jobs = [await readers.job(driver, j) for j in ids]
    many = await eligibility.explain_many(driver, jobs)
    assert set(many) == set(ids)
    for job_id in ids:
        assert many[job_id] == await eligibility.explain(driver, job_id)
