"""Bulk submit (issue 18): many jobs in one statement, under one submit's rules."""

from __future__ import annotations

import asyncio
import json
import select
import threading
from pathlib import Path

import psycopg
import pytest

from fleetq.core import producer, queries, roles
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import AsyncpgDriver, Driver
from fleetq.core.errors import IdempotencyConflict, InvalidInput, NotAllowed
from fleetq.core.models import SubmitResult
from fleetq.core.producer import JobSpec
from tests import fleet
from tests.fleet import OTHER_SHA, SHA
from tests.integration.conftest import Cli, Login
from tests.locks import blocked_or_done, wait_for


@pytest.fixture
def ops(sync_conn: SyncConnection) -> SyncConnection:
    """The test fleet's projects and operations (the cli and login fixtures add them too)."""
    fleet.operations(sync_conn)
    return sync_conn


def _count(conn: SyncConnection, table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM fleetq.{table}".encode()).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_batch_is_one_submit_per_job_in_order(
    driver: Driver, ops: SyncConnection, db_dsn: str
) -> None:
    sync_conn = ops
    jobs: list[JobSpec] = [
        {"project": "tools", "operation": "lint", "commit": SHA, "payload": {"n": n}}
        for n in range(300)
    ]
    jobs.insert(7, {"project": "webapp", "operation": "notify", "commit": SHA.upper()})
    with psycopg.connect(db_dsn, autocommit=True) as listener:
        listener.execute("LISTEN fleetq_work")
        answers = await producer.submit_many(driver, jobs, submitted_by="ci")
        lanes = _notified(listener)
    assert len(answers) == 301 and all(a.created for a in answers)
    ids = [a.job_id for a in answers]
    assert ids == sorted(ids)  # input order
    assert answers[7].priority_class == 1 and answers[0].priority_class == 2  # derived
    rows = sync_conn.execute(
        "SELECT id, lane, payload, commit_sha, submitted_by FROM fleetq.jobs ORDER BY id"
    ).fetchall()
    assert [r[0] for r in rows] == ids
    assert rows[0][2] == {"n": 0} and rows[7][1] == "control" and rows[7][3] == SHA
    assert {r[4] for r in rows} == {"ci"}
    assert _count(sync_conn, "events") == 301
    assert sorted(lanes) == ["checks", "control"]  # one wake-up per lane
    release = await producer.submit_many(driver, jobs[:1], submitted_by="release-bot")
    assert release[0].priority_class == 0


def _notified(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    """The payloads of what has arrived (a NOTIFY is delivered at its commit)."""
    select.select([conn.fileno()], [], [], 5)
    return [n.payload for n in conn.notifies(timeout=0.5)]


async def test_keys_answer_their_jobs_and_a_conflict_writes_nothing(
    driver: Driver, ops: SyncConnection
) -> None:
    sync_conn = ops
    first = await producer.submit(
        driver,
        project="tools",
        operation="lint",
        commit=SHA,
        submitted_by="ci",
        idempotency_key="k1",
    )
    same: JobSpec = {
        "project": "tools",
        "operation": "lint",
        "commit": SHA,
        "idempotency_key": "k1",
    }
    fresh: JobSpec = {
        "project": "tools",
        "operation": "lint",
        "commit": SHA,
        "idempotency_key": "k2",
    }
    answers = await producer.submit_many(driver, [fresh, same, fresh], submitted_by="ci")
    assert [a.created for a in answers] == [True, False, False]
    assert answers[1].job_id == first.job_id and answers[2].job_id == answers[0].job_id
    before = _count(sync_conn, "jobs")
    other: JobSpec = {**same, "commit": OTHER_SHA}
    with pytest.raises(IdempotencyConflict, match="job 2: idempotency key already names job"):
        await producer.submit_many(
            driver,
            [{"project": "tools", "operation": "lint", "commit": SHA}, other],
            submitted_by="ci",
        )
    assert _count(sync_conn, "jobs") == before
    # one key twice in a batch, for two requests: named by their positions (the job the
    # first one would have made is never committed)
    with pytest.raises(
        IdempotencyConflict, match="job 3: repeats the idempotency key of job 1 of this batch"
    ):
        await producer.submit_many(
            driver,
            [{**same, "idempotency_key": "k3"}, fresh, {**other, "idempotency_key": "k3"}],
            submitted_by="ci",
        )
    assert _count(sync_conn, "jobs") == before


async def test_a_bad_job_is_named_and_nothing_is_queued(
    driver: Driver, ops: SyncConnection
) -> None:
    sync_conn = ops
    good: JobSpec = {"project": "tools", "operation": "lint", "commit": SHA}
    with pytest.raises(InvalidInput, match=r"^job 2: commit must be a full 40-character hex"):
        await producer.submit_many(driver, [good, {**good, "commit": "abc"}], submitted_by="ci")
    with pytest.raises(NotAllowed, match="job 3: project tools does not allow operation nope"):
        await producer.submit_many(
            driver, [good, good, {**good, "operation": "nope"}], submitted_by="ci"
        )
    with pytest.raises(InvalidInput, match="job 1: commit is required"):
        await producer.submit_many(driver, [_without_commit()], submitted_by="ci")
    # a client that skips the Python checks meets the database's, with the same words
    with pytest.raises(InvalidInput, match="job 2: commit must be a full 40-character hex"):
        await driver.fetch(
            queries.sql("jobs_submit_many"),
            ["tools"] * 2,
            ["lint"] * 2,
            [SHA, "abc"],
            [None] * 2,
            [None] * 2,
            [None] * 2,
            ["{}"] * 2,
            [None] * 2,
            "ci",
        )
    assert _count(sync_conn, "jobs") == 0 and _count(sync_conn, "events") == 0
    assert await producer.submit_many(driver, [], submitted_by="ci") == []


def _without_commit() -> JobSpec:
    job: dict[str, str] = {"project": "tools", "operation": "lint"}
    return job  # type: ignore[return-value]


async def test_a_submitter_login_submits_a_batch_as_itself(login: Login, driver: Driver) -> None:
    as_alice = await AsyncpgDriver.connect(login(roles.Kind.SUBMITTER, "alice"))
    try:
        (answer,) = await producer.submit_many(
            as_alice,
            [{"project": "webapp", "operation": "unit", "commit": SHA}],
            submitted_by="release-bot",
        )
    finally:
        await as_alice.close()
    rows = await driver.fetch(
        "SELECT submitted_by, priority_class FROM fleetq.jobs WHERE id = $1", answer.job_id
    )
    assert rows[0]["submitted_by"] == "alice" and rows[0]["priority_class"] == 1


def test_submit_from_a_file(cli: Cli, tmp_path: Path, sync_conn: SyncConnection) -> None:
    path = tmp_path / "jobs.jsonl"
    lines = [
        json.dumps({"project": "tools", "operation": "lint", "commit": SHA, "key": "a"}),
        "",
        json.dumps({"project": "webapp", "operation": "unit", "commit": SHA, "payload": {"x": 1}}),
    ]
    path.write_text("\n".join(lines) + "\n")
    code, out, err = cli("submit", "--from-file", str(path))
    assert (code, out.strip()) == (0, f"2 job(s) queued from {path}"), err
    code, out, _ = cli("submit", "--from-file", str(path), "--json")
    assert code == 0 and [a["created"] for a in json.loads(out)] == [False, True]
    # a bad job is named by its line, and nothing of the file is queued
    before = _count(sync_conn, "jobs")
    path.write_text(
        lines[0] + "\n\n" + json.dumps({"project": "tools", "operation": "x", "commit": SHA}) + "\n"
    )
    code, _, err = cli("submit", "--from-file", str(path))
    assert code == 65 and "line 3: project tools does not allow operation x" in err
    assert "nothing was queued" in err and _count(sync_conn, "jobs") == before
    path.write_text('{"project": "tools", "operation": "lint", "commit": "abc"}\n{oops\n')
    code, _, err = cli("submit", "--from-file", str(path))
    assert code == 64 and "line 2: not valid JSON" in err
    path.write_text('{"project": "tools", "operation": "lint", "sha": "abc"}\n')
    code, _, err = cli("submit", "--from-file", str(path))
    assert code == 64 and "line 1: unknown field 'sha'" in err
    code, _, err = cli("submit", "tools", "lint", "--from-file", str(path))
    assert code == 64 and "PROJECT belongs in its lines" in err
    code, _, err = cli("submit", "--from-file", str(path), "--node", "n1")
    assert code == 64 and "--node belongs in its lines" in err
    # a line ends at \n only: U+2028 and a form feed may stand inside a JSON string
    odd = {"project": "tools", "operation": "lint", "commit": SHA, "payload": {"a": "x\u2028\fy"}}
    path.write_text(json.dumps(odd, ensure_ascii=False) + "\r\n")
    code, out, err = cli("submit", "--from-file", str(path), "--json")
    assert code == 0, err
    (made,) = json.loads(out)
    row = sync_conn.execute(
        "SELECT payload FROM fleetq.jobs WHERE id = $1", [made["job_id"]]
    ).fetchone()
    assert row == ({"a": "x\u2028\fy"},)
    code, _, err = cli("submit", "tools")
    assert code == 64 and "PROJECT OPERATION --commit SHA, or --from-file" in err


async def test_columns_of_different_lengths_are_refused(
    driver: Driver, ops: SyncConnection
) -> None:
    """unnest pads a short array with NULLs: a node given for one job of two would have
    silently gone missing on the other."""
    with pytest.raises(InvalidInput, match="one-dimensional arrays of one length"):
        await driver.fetch(
            queries.sql("jobs_submit_many"),
            ["tools"] * 2,
            ["lint"] * 2,
            [SHA] * 2,
            ["node-a"],
            None,
            None,
            None,
            None,
            "ci",
        )
    assert _count(ops, "jobs") == 0


async def test_a_caller_s_temporary_table_cannot_run_code_as_the_owner(
    login: Login, sync_conn: SyncConnection
) -> None:
    """The batch once went through a temporary table created IF NOT EXISTS: a submitter
    that made one of that name first, with a trigger, ran its trigger as the schema's
    owner. Whatever the function uses now, a caller's temporary objects are not it."""
    dsn = login(roles.Kind.SUBMITTER, "mallory")
    with psycopg.connect(dsn) as conn, psycopg.RawCursor(conn) as cursor:
        cursor.execute(
            "CREATE TEMP TABLE fleetq_batch (n int, id bigint, project text, operation text, "
            "commit_sha text, node text, key text, task text, payload jsonb, traceparent "
            "text, lane text, capabilities text[], memory_mb int, cpu_millis int, "
            "timeout_s int, class smallint, retired bool, known bool); "
            "GRANT ALL ON fleetq_batch TO PUBLIC; "
            "CREATE FUNCTION pg_temp.evil() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO fleetq.identities (name, role) VALUES ('mallory', "
            "'release-verification'); RETURN NEW; END $$; "
            "CREATE TRIGGER evil BEFORE INSERT ON fleetq_batch FOR EACH ROW "
            "EXECUTE FUNCTION pg_temp.evil()"
        )
        cursor.execute(
            queries.sql("jobs_submit_many"),
            [["tools"], ["lint"], [SHA], None, None, None, None, None, "x"],
        )
        conn.commit()
    row = sync_conn.execute(
        "SELECT count(*) FROM fleetq.identities WHERE name = 'mallory'"
    ).fetchone()
    assert row == (0,)


async def test_two_batches_with_keys_in_common_never_deadlock(
    driver: Driver, ops: SyncConnection, db_dsn: str
) -> None:
    """The rows go in ordered by key, so two batches that share keys, in opposite
    orders, lock them in one order: one waits for the other, neither is refused."""
    keys = [f"k{n:05d}" for n in range(3000)]

    def batch(order: list[str]) -> list[JobSpec]:
        return [
            {"project": "tools", "operation": "lint", "commit": SHA, "idempotency_key": k}
            for k in order
        ]

    async def submit(order: list[str]) -> list[SubmitResult]:
        conn = await AsyncpgDriver.connect(db_dsn)
        try:
            return await producer.submit_many(conn, batch(order), submitted_by="ci")
        finally:
            await conn.close()

    first, second = await asyncio.gather(submit(keys), submit(keys[::-1]))
    assert sum(a.created for a in first + second) == 3000
    assert {a.job_id for a in first} == {a.job_id for a in second}


def _batch(conn: SyncConnection, project: str, operation: str) -> list[int]:
    rows = conn.execute(
        "SELECT job_id FROM fleetq.submit_many(ARRAY[$1], ARRAY[$2], ARRAY[$3], "
        "NULL, NULL, NULL, NULL, NULL, 'a')",
        [project, operation, SHA],
    ).fetchall()
    return [int(r[0]) for r in rows]


def test_a_batch_orders_itself_only_against_the_removal_of_its_own_operations(
    ops: SyncConnection, db_dsn: str
) -> None:
    """A removal in flight holds its operation's row: a batch of another operation goes
    on at once; a batch of that one waits for it, and is then refused, not written for
    an operation that no longer exists (mutants of submit_many's lock on its
    operations)."""
    outcome: list[BaseException | list[int]] = []
    with connect(db_dsn) as remover, connect(db_dsn, autocommit=True) as submitter:
        remover.execute("SELECT * FROM fleetq.retire_operation('tools', 'lint', 'ops')")
        submitter.execute("SET lock_timeout = '5s'")  # a batch that waits fails, not hangs
        assert len(_batch(submitter, "webapp", "unit")) == 1
        (pid,) = submitter.execute("SELECT pg_backend_pid()").fetchone() or (0,)

        def submit() -> None:
            try:
                outcome.append(_batch(submitter, "tools", "lint"))
            except psycopg.Error as exc:
                outcome.append(exc)

        thread = threading.Thread(target=submit)
        thread.start()
        wait_for(lambda: blocked_or_done(db_dsn, int(pid), thread), "the batch to wait")
        remover.commit()
        thread.join(timeout=30)
    assert len(outcome) == 1 and isinstance(outcome[0], psycopg.Error), outcome
    assert "was removed" in str(outcome[0])
    assert _count(ops, "jobs") == 1
