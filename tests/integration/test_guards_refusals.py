"""Refusals of the protocol SQL that only the SQL makes (issue 43: every guard has a
mutant, and each mutant a test that catches it). Each test calls the protocol as the
login that would send the bad call, past any check the Python clients make first."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from fleetq.core import eligibility, leasing, roles
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import Driver
from fleetq.core.models import JobId
from tests import fleet
from tests.fleet import SHA
from tests.integration.conftest import Login

RUNNER = "node-a/r1"


def _refused(conn: SyncConnection, statement: str, params: list[object], code: str) -> None:
    with pytest.raises(psycopg.Error) as exc:
        conn.execute(statement.encode(), params)
    assert exc.value.sqlstate == code, exc.value


@pytest.fixture
def as_runner(login: Login, sync_conn: SyncConnection) -> Iterator[SyncConnection]:
    """node-a/r1's own login, registered."""
    sync_conn.execute(
        b"SELECT fleetq.register_runner('node-a', 'r1', '{}', 16384, 8000, ARRAY['checks'], "
        b"ARRAY[4], 'x', 1)"
    )
    with connect(login(roles.Kind.RUNNER, RUNNER), autocommit=True) as conn:
        yield conn


def _submit(conn: SyncConnection, commit: str = SHA) -> int:
    row = conn.execute(
        b"SELECT job_id FROM fleetq.submit('tools', 'lint', $1, NULL, NULL, NULL, 'alice', "
        b"'{}', NULL, NULL)",
        [commit],
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_an_outcome_is_succeeded_failed_or_refused(
    as_runner: SyncConnection, sync_conn: SyncConnection
) -> None:
    """'cancelled' is a state a job may have, but no outcome a runner reports: a runner
    that sent it would end the job as if an operator had cancelled it."""
    job = _submit(sync_conn)
    claimed = as_runner.execute(
        b"SELECT job_id, lease_version FROM fleetq.claim($1, 'checks', 1, NULL)", [RUNNER]
    ).fetchall()
    assert [row[0] for row in claimed] == [job]
    version = claimed[0][1]
    for outcome in ("cancelled", "queued", "bogus"):
        _refused(
            as_runner,
            "SELECT * FROM fleetq.complete($1, ARRAY[$2::bigint], ARRAY[$3::bigint], "
            "ARRAY[$4], ARRAY[0], ARRAY[NULL::text], ARRAY[''], ARRAY[0], ARRAY[0], "
            "ARRAY[NULL::integer])",
            [RUNNER, job, version, outcome],
            "FQ003",
        )
    row = sync_conn.execute(b"SELECT state FROM fleetq.jobs WHERE id = $1", [job]).fetchone()
    assert row == ("claimed",)


def test_a_stop_of_a_job_that_does_not_exist_is_not_found(as_runner: SyncConnection) -> None:
    """A runner confirming the stop of a job that is gone (pruned) hears "unknown job", not
    "stale", which would count it as a zombie's write."""
    _refused(
        as_runner,
        "SELECT fleetq.confirm_stop($1, 987654321, 1, 15, 'cancelled')",
        [RUNNER],
        "FQ004",
    )


@pytest.mark.parametrize("commit", [SHA[:12], SHA.upper(), SHA + "0", "main"])
def test_the_database_takes_a_full_lower_case_sha_only(
    sync_conn: SyncConnection, login: Login, commit: str
) -> None:
    """The CLI and the API check the commit first; the database refuses it too, for every
    other client of fleetq.submit."""
    _refused(
        sync_conn,
        "SELECT job_id FROM fleetq.submit('tools', 'lint', $1, NULL, NULL, NULL, 'alice', "
        "'{}', NULL, NULL)",
        [commit],
        "FQ003",
    )


def test_a_cancel_of_an_ended_job_changes_nothing(
    as_runner: SyncConnection, sync_conn: SyncConnection
) -> None:
    """An ended job keeps its outcome: a cancel after it answers the state it ended in."""
    job = _submit(sync_conn)
    ((_, version),) = as_runner.execute(
        b"SELECT job_id, lease_version FROM fleetq.claim($1, 'checks', 1, NULL)", [RUNNER]
    ).fetchall()
    as_runner.execute(
        b"SELECT * FROM fleetq.complete($1, ARRAY[$2::bigint], ARRAY[$3::bigint], "
        b"ARRAY['succeeded'], ARRAY[0], ARRAY[NULL::text], ARRAY[''], ARRAY[0], ARRAY[0], "
        b"ARRAY[NULL::integer])",
        [RUNNER, job, version],
    )
    answer = sync_conn.execute(
        b"SELECT previous_state, state, stop_pending FROM fleetq.cancel($1, 'ops', 'late')",
        [job],
    ).fetchall()
    assert answer == [("succeeded", "succeeded", False)]
    row = sync_conn.execute(
        b"SELECT j.state, v.verdict FROM fleetq.jobs j JOIN fleetq.verdicts v ON v.job_id = j.id "
        b"WHERE j.id = $1",
        [job],
    ).fetchone()
    assert row == ("succeeded", "passed")


async def test_a_runner_with_every_slot_busy_is_not_eligible(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """Slots alone: memory and CPU to spare, but the lane's one slot is taken."""
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver, lanes={"checks": 1, "control": 1})
    jobs = []
    for _ in range(2):
        row = sync_conn.execute(
            b"SELECT job_id FROM fleetq.submit('tools', 'lint', $1, NULL, NULL, NULL, 'alice', "
            b"'{}', NULL, NULL)",
            [SHA],
        ).fetchone()
        assert row is not None
        jobs.append(JobId(int(row[0])))
    assert len(await leasing.claim(driver, runner=runner, lane="checks", limit=5)) == 1
    (verdict,) = (await eligibility.explain(driver, jobs[1])).runners
    assert verdict.reason == "slots"


async def test_a_job_needing_more_memory_than_is_free_is_not_eligible(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """Memory alone: CPU to spare is not enough (the claim's batch sum would still keep
    the job, but the rule and its explainer must say why)."""
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver, memory_mb=512, cpu_millis=100_000)
    row = sync_conn.execute(
        b"SELECT job_id FROM fleetq.submit('webapp', 'unit', $1, NULL, NULL, NULL, 'alice', "
        b"'{}', NULL, NULL)",  # 1024 MB
        [SHA],
    ).fetchone()
    assert row is not None
    assert await leasing.claim(driver, runner=runner, lane="checks", limit=5) == []
    (verdict,) = (await eligibility.explain(driver, JobId(int(row[0])))).runners
    assert verdict.reason == "memory"
