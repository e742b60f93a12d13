"""`fleetq rerun JOB` submits an ended job's check again, as a new job linked to the old
(issue 42, "A CI gate can wait"): the same check, as whoever asks, refused while the job
is live, and nothing for a login that may not submit."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from fleetq.cli.main import main as fleetq
from fleetq.core import leasing, producer, roles
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver
from fleetq.core.models import JobId, Outcome, OutcomeReport
from tests import fleet
from tests.fleet import SHA
from tests.integration.conftest import Cli, Login

PAYLOAD = {"suite": "unit", "n": [1, 2]}


async def _failed(driver: Driver) -> JobId:
    """A job of ci-bot that ran and failed, with a node, a task and a payload."""
    job = (
        await producer.submit(
            driver,
            project="tools",
            operation="lint",
            commit=SHA,
            submitted_by="ci-bot",
            task_id="T-7",
            payload=PAYLOAD,
        )
    ).job_id
    runner = await fleet.runner(driver)
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    await leasing.complete(
        driver,
        runner=runner,
        outcome=OutcomeReport(
            job_id=claim.job_id, lease_version=claim.lease_version, outcome=Outcome.FAILED
        ),
    )
    return job


def _job(conn: SyncConnection, job: int) -> tuple[object, ...]:
    row = conn.execute(
        b"SELECT project, operation, commit_sha, requested_node, task_id, payload, "
        b"submitted_by, state FROM fleetq.jobs WHERE id = $1",
        [job],
    ).fetchone()
    assert row is not None
    return tuple(row)


def _rerun_of(conn: SyncConnection, job: int) -> list[object]:
    rows = conn.execute(
        b"SELECT (detail->>'rerun_of')::bigint FROM fleetq.events "
        b"WHERE job_id = $1 AND kind = 'rerun'",
        [job],
    ).fetchall()
    return [r[0] for r in rows]


def _jobs(conn: SyncConnection) -> int:
    row = conn.execute(b"SELECT count(*) FROM fleetq.jobs").fetchone()
    assert row is not None
    return int(row[0])


async def test_a_rerun_is_the_same_check_as_a_new_job_linked_to_the_old(
    cli: Cli, driver: Driver, sync_conn: SyncConnection
) -> None:
    old = await _failed(driver)
    assert cli("result", "tools", SHA)[0] == 1
    code, out, _ = cli("rerun", str(old), "--json", "--as", "release-bot")
    assert code == 0, out
    answer = json.loads(out)
    new = answer["job_id"]
    assert answer["created"] is True and answer["rerun_of"] == old and new != old
    was, now = _job(sync_conn, old), _job(sync_conn, new)
    assert now[:6] == was[:6]  # project, operation, commit, node, task, payload
    assert now[6:] == ("release-bot", "queued")
    assert _rerun_of(sync_conn, new) == [old]
    code, out, _ = cli("result", "tools", SHA)
    # the verdict stands until the rerun decides; the rerun is shown beside it
    assert code == 1 and f"{new} queued" in out, out


async def test_a_key_makes_a_repeated_rerun_answer_the_same_job(
    cli: Cli, driver: Driver, sync_conn: SyncConnection
) -> None:
    old = await _failed(driver)
    code, out, _ = cli("rerun", str(old), "--key", "retry-1")
    assert code == 0 and f"a rerun of job {old}" in out, out
    before = _jobs(sync_conn)
    code, out, _ = cli("rerun", str(old), "--key", "retry-1")
    assert code == 0 and "already exists" in out, out
    assert _jobs(sync_conn) == before


async def test_a_live_or_unknown_job_is_refused_and_nothing_is_queued(
    cli: Cli, driver: Driver, sync_conn: SyncConnection
) -> None:
    live = (
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
        )
    ).job_id
    before = _jobs(sync_conn)
    code, _, err = cli("rerun", str(live))
    assert code == 75 and "still queued" in err, err
    code, _, err = cli("rerun", "999999")
    assert code == 65 and "unknown job 999999" in err, err
    assert _jobs(sync_conn) == before


def _as(dsn: str, *argv: str) -> int:
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fleetq, ["--dsn", dsn, *argv]).result()


@pytest.mark.parametrize(
    ("kind", "status", "submitted_by"),
    [
        (roles.Kind.SUBMITTER, 0, "nightly-bot"),  # anyone's check, as itself
        (roles.Kind.OPERATOR, 0, "alice"),
        (roles.Kind.READER, 77, None),
        (roles.Kind.RUNNER, 77, None),
    ],
)
async def test_a_login_reruns_as_itself_or_not_at_all(
    login: Login,
    driver: Driver,
    sync_conn: SyncConnection,
    kind: roles.Kind,
    status: int,
    submitted_by: str | None,
) -> None:
    old = await _failed(driver)
    subject = "node-z/r" if kind is roles.Kind.RUNNER else (submitted_by or "dashboard")
    dsn = login(kind, subject)
    before = _jobs(sync_conn)
    assert _as(dsn, "rerun", str(old), "--as", "ci-bot") == status
    if submitted_by is None:
        assert _jobs(sync_conn) == before
        return
    (new,) = sync_conn.execute(
        b"SELECT job_id FROM fleetq.events WHERE kind = 'rerun'"
    ).fetchone() or (None,)
    assert new is not None and _job(sync_conn, new)[6] == submitted_by
