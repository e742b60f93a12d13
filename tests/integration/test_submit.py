"""Submit: validated before SQL, priority derived, idempotent under concurrency,
transactional on the caller's connection."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from fleetq.core import producer, readers
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import AsyncpgDriver, Driver, open_driver
from fleetq.core.errors import IdempotencyConflict, InvalidInput, NotAllowed
from fleetq.core.models import JobId, JobState, SubmitResult
from tests import fleet
from tests.fleet import SHA


@pytest.fixture(autouse=True)
def _fleet(sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)


async def _submit(driver: Driver, **kw: object) -> SubmitResult:
    args: dict[str, object] = {
        "project": "tools",
        "operation": "lint",
        "commit": SHA,
        "submitted_by": "alice",
    }
    args.update(kw)
    return await producer.submit(driver, **args)  # type: ignore[arg-type]


async def test_submit_creates_a_queued_job_with_a_snapshot_of_requirements(driver: Driver) -> None:
    answer = await _submit(driver, payload={"suite": "all"})
    assert answer.created and answer.state == JobState.QUEUED
    job = await readers.job(driver, answer.job_id)
    assert (job.lane, job.memory_mb, job.cpu_millis) == ("checks", 256, 500)
    assert job.lease_version == 0 and job.lease_owner is None


@pytest.mark.parametrize(
    ("project", "operation", "who", "expected"),
    [
        ("tools", "lint", "release-bot", 0),
        ("webapp", "unit", "alice", 1),
        ("tools", "lint", "alice", 2),
        ("webapp", "unit", "release-bot", 0),
    ],
)
async def test_priority_class_is_derived(
    driver: Driver, project: str, operation: str, who: str, expected: int
) -> None:
    answer = await _submit(driver, project=project, operation=operation, submitted_by=who)
    assert answer.priority_class == expected


async def test_repeat_with_same_key_returns_the_same_job_whatever_its_state(driver: Driver) -> None:
    first = await _submit(driver, idempotency_key="build-7")
    await producer.cancel(driver, job_id=first.job_id, actor="ops")
    again = await _submit(driver, idempotency_key="build-7")
    assert (again.job_id, again.created, again.state) == (first.job_id, False, JobState.CANCELLED)


async def test_same_key_with_other_parameters_is_refused(driver: Driver) -> None:
    await _submit(driver, idempotency_key="k", payload={"a": 1})
    with pytest.raises(IdempotencyConflict, match="other parameters"):
        await _submit(driver, idempotency_key="k", payload={"a": 2})
    with pytest.raises(IdempotencyConflict):
        await _submit(driver, idempotency_key="k", payload={"a": 1}, commit="a" * 40)


async def test_same_key_with_other_dependencies_is_refused(driver: Driver) -> None:
    """A repeat with other `after` jobs is another request (issue 43, finding 2: it got
    the first job back, `created=false`, without the dependencies it asked for); the
    same ones in another order, or from a span of its own, are the same request."""
    a, b = (await _submit(driver)).job_id, (await _submit(driver)).job_id
    first = await _submit(driver, idempotency_key="k", after=[a, b])
    again = await _submit(
        driver,
        idempotency_key="k",
        after=[b, a, b],
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    assert (again.job_id, again.created) == (first.job_id, False)
    for other in ([a], [], None):
        with pytest.raises(IdempotencyConflict, match="other parameters"):
            await _submit(driver, idempotency_key="k", after=other)
    plain = await _submit(driver, idempotency_key="plain")
    with pytest.raises(IdempotencyConflict):
        await _submit(driver, idempotency_key="plain", after=[a])

    def batch(key: str) -> producer.JobSpec:
        return {"project": "tools", "operation": "lint", "commit": SHA, "idempotency_key": key}

    with pytest.raises(IdempotencyConflict):  # a batch's jobs wait on nothing
        await producer.submit_many(driver, [batch("k")], submitted_by="alice")
    (same,) = await producer.submit_many(driver, [batch("plain")], submitted_by="alice")
    assert (same.job_id, same.created) == (plain.job_id, False)


async def test_keys_are_per_project(driver: Driver) -> None:
    a = await _submit(driver, idempotency_key="k")
    b = await _submit(driver, idempotency_key="k", project="webapp", operation="unit")
    assert a.job_id != b.job_id and b.created


async def test_twenty_concurrent_submits_of_one_key_make_one_job(db_dsn: str) -> None:
    drivers = [await _open(db_dsn) for _ in range(20)]
    try:
        answers = await asyncio.gather(
            *(_submit(d, idempotency_key="race", payload={"n": 1}) for d in drivers)
        )
    finally:
        await asyncio.gather(*(d.close() for d in drivers))
    assert len({a.job_id for a in answers}) == 1
    assert sum(a.created for a in answers) == 1
    async with open_driver(db_dsn) as d:
        assert len(await readers.jobs(d)) == 1


async def _open(dsn: str) -> Driver:
    return await AsyncpgDriver.connect(dsn)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"commit": "abc123"}, "full 40-character hex SHA"),
        ({"commit": "--upload-pack=evil" + "0" * 22}, "looks like a command-line option"),
        ({"commit": "g" * 40}, "not all hex"),
        ({"idempotency_key": "a\x00b"}, "idempotency key contains NUL"),
        ({"task_id": "bad\udcff"}, "task id is not valid UTF-8"),
        ({"submitted_by": ""}, "submitted by must be a non-empty string"),
        ({"payload": {"blob": "x" * 70_000}}, "over the limit"),
        ({"payload": {"nul": "a\x00"}}, "payload contains a NUL"),
        ({"payload": ["not", "an", "object"]}, "payload must be a JSON object"),
    ],
)
async def test_bad_input_is_refused_before_sql_without_echo(
    driver: Driver, changes: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message) as caught:
        await _submit(driver, **changes)
    assert "xxxxxxxx" not in str(caught.value) and "evil" not in str(caught.value)
    assert await readers.jobs(driver) == []


async def test_upper_case_sha_is_normalised(driver: Driver) -> None:
    answer = await _submit(driver, commit=SHA.upper())
    assert (await readers.job(driver, answer.job_id)).commit_sha == SHA


async def test_database_enforces_the_configured_payload_limit(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    sync_conn.execute("UPDATE fleetq.settings SET value = '20' WHERE name = 'max_payload_bytes'")
    with pytest.raises(InvalidInput, match="over the limit of 20"):
        await _submit(driver, payload={"text": "more than twenty bytes"})


@pytest.mark.parametrize(
    ("project", "operation", "message"),
    [
        ("nope", "lint", "unknown project nope"),
        ("tools", "deploy", "does not allow operation deploy"),
    ],
)
async def test_unregistered_work_is_not_allowed(
    driver: Driver, project: str, operation: str, message: str
) -> None:
    with pytest.raises(NotAllowed, match=message):
        await _submit(driver, project=project, operation=operation)


def test_submit_in_transaction_commits_and_rolls_back_with_the_caller(db_dsn: str) -> None:
    with connect(db_dsn) as conn:
        conn.execute("CREATE TABLE app_orders (id int)")
        conn.commit()
        with conn.transaction():
            conn.execute("INSERT INTO app_orders VALUES (1)")
            kept = producer.submit_in_transaction(
                conn, project="tools", operation="lint", commit=SHA, submitted_by="app"
            )
        with pytest.raises(RuntimeError, match="fails after enqueueing"):
            _enqueue_then_fail(conn)
        rows = conn.execute("SELECT id, idempotency_key FROM fleetq.jobs").fetchall()
        assert rows == [(kept.job_id, None)]
        assert conn.execute("SELECT id FROM app_orders").fetchall() == [(1,)]


def _enqueue_then_fail(conn: SyncConnection) -> None:
    with conn.transaction():
        conn.execute("INSERT INTO app_orders VALUES (2)")
        producer.submit_in_transaction(
            conn,
            project="tools",
            operation="lint",
            commit=SHA,
            submitted_by="app",
            idempotency_key="rolled-back",
        )
        raise RuntimeError("the application fails after enqueueing")


def test_submit_in_transaction_maps_errors(db_dsn: str) -> None:
    with psycopg.connect(db_dsn) as conn, pytest.raises(NotAllowed):
        producer.submit_in_transaction(
            conn, project="nope", operation="x", commit=SHA, submitted_by="app"
        )


async def test_cancelled_queued_job_is_terminal_and_has_a_cancelled_result(driver: Driver) -> None:
    answer = await _submit(driver)
    result = await producer.cancel(driver, job_id=answer.job_id, actor="ops", reason="not needed")
    assert (result.previous_state, result.state, result.stop_pending) == (
        JobState.QUEUED,
        JobState.CANCELLED,
        False,
    )
    again = await producer.cancel(driver, job_id=JobId(answer.job_id), actor="ops")
    assert again.previous_state == JobState.CANCELLED  # a no-op, said plainly
    (verdict,) = await readers.result(driver, project="tools", commit=SHA)
    assert verdict.status == "cancelled"


async def test_a_raised_payload_limit_is_the_one_that_holds(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """The limit is the database's setting: a payload over the default is taken once the
    setting allows it (a fixed limit in the client refused it; found in review)."""
    big = {"blob": "x" * 100_000}
    with pytest.raises(InvalidInput, match="over the limit of 65536"):
        await _submit(driver, payload=big)
    sync_conn.execute(
        "UPDATE fleetq.settings SET value = '200000' WHERE name = 'max_payload_bytes'"
    )
    answer = await _submit(driver, payload=big)
    assert (await readers.job(driver, answer.job_id)).payload == big
