"""Least privilege (issue 13): each login acts only as what it is. Every test here
passed a forbidden call on the schema before migration 0007, where any connection could
act as any runner and choose who submitted."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from fleetq.cli.main import main as fleetq
from fleetq.core import eligibility, jobpages, leasing, producer, readers, roles, stats, views
from fleetq.core import fleet as fleet_api
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import AsyncpgDriver, Driver
from fleetq.core.errors import FleetqError, PermissionDenied
from fleetq.core.models import JobId, Outcome, OutcomeReport, RunnerId
from tests import fleet
from tests.fleet import SHA
from tests.integration.conftest import Login, login_dsn


@pytest.fixture
async def runner_a(login: Login, driver: Driver) -> AsyncIterator[Driver]:
    """Runner `node-a/r1`, registered, as its own login; `node-b/r2` exists too."""
    dsn = login(roles.Kind.RUNNER, "node-a/r1")
    await fleet.runner(driver, "r2", node="node-b")
    as_a = await AsyncpgDriver.connect(dsn)
    try:
        await fleet.runner(as_a, "r1", node="node-a")
        yield as_a
    finally:
        await as_a.close()


async def _submit(driver: Driver, who: str = "alice") -> JobId:
    answer = await producer.submit(
        driver, project="tools", operation="lint", commit=SHA, submitted_by=who
    )
    return answer.job_id


def _refused(exc: pytest.ExceptionInfo[BaseException]) -> None:
    assert isinstance(exc.value, PermissionDenied), repr(exc.value)


async def test_a_runner_login_works_as_itself(runner_a: Driver, driver: Driver) -> None:
    """The whole protocol through the runner's own login (every grant it needs)."""
    job = await _submit(driver)
    (claim,) = await leasing.claim(runner_a, runner=RunnerId("node-a/r1"), lane="checks", limit=1)
    assert claim.job_id == job
    beats = await leasing.heartbeat(
        runner_a, runner=RunnerId("node-a/r1"), leases=[(claim.job_id, claim.lease_version)]
    )
    assert [b.status for b in beats] == ["ok"]
    report = OutcomeReport(
        job_id=claim.job_id, lease_version=claim.lease_version, outcome=Outcome.SUCCEEDED
    )
    assert await leasing.complete(runner_a, runner=RunnerId("node-a/r1"), outcome=report) == "ok"


async def test_a_runner_login_cannot_act_as_another_runner(
    runner_a: Driver, driver: Driver
) -> None:
    """A second login committed `complete(p_runner => 'node-a/r')` for another runner's
    job; now a runner login naming any runner but its own is refused."""
    await _submit(driver)
    (held_by_b,) = await leasing.claim(driver, runner=RunnerId("node-b/r2"), lane="checks", limit=1)
    b = RunnerId("node-b/r2")
    with pytest.raises(FleetqError) as exc:
        await leasing.claim(runner_a, runner=b, lane="checks", limit=1)
    _refused(exc)
    with pytest.raises(FleetqError) as exc:
        await leasing.heartbeat(
            runner_a, runner=b, leases=[(held_by_b.job_id, held_by_b.lease_version)]
        )
    _refused(exc)
    report = OutcomeReport(
        job_id=held_by_b.job_id, lease_version=held_by_b.lease_version, outcome=Outcome.FAILED
    )
    with pytest.raises(FleetqError) as exc:
        await leasing.complete(runner_a, runner=b, outcome=report)
    _refused(exc)
    with pytest.raises(FleetqError) as exc:
        await leasing.release(
            runner_a,
            runner=b,
            job_id=held_by_b.job_id,
            token=held_by_b.lease_version,
            reason="x",
        )
    _refused(exc)
    # under its own name the job is not its to finish: stale, as for any zombie
    answers = await leasing.complete_many(runner_a, runner=RunnerId("node-a/r1"), outcomes=[report])
    assert [a.status for a in answers] == ["stale"]


async def test_a_runner_login_cannot_touch_tables_submit_or_cancel(
    runner_a: Driver, driver: Driver
) -> None:
    """A plain `UPDATE fleetq.jobs SET lease_version = 0` rewound a fencing token."""
    job = await _submit(driver)
    for statement in (
        "SELECT * FROM fleetq.jobs",
        "UPDATE fleetq.jobs SET lease_version = 0",
        "DELETE FROM fleetq.events",
        "SELECT * FROM fleetq.claim_unchecked('node-b/r2', 'checks', 1, gen_random_uuid())",
    ):
        with pytest.raises(FleetqError) as exc:
            await runner_a.fetch(statement)
        _refused(exc)
    with pytest.raises(FleetqError) as exc:
        await _submit(runner_a)
    _refused(exc)
    with pytest.raises(FleetqError) as exc:
        await producer.cancel(runner_a, job_id=job, actor="mallory", reason="x")
    _refused(exc)
    await leasing.reap(runner_a)  # any runner may lead the reaper ...
    with pytest.raises(FleetqError) as exc:  # ... but not move its clock
        await leasing.reap(runner_a, now=datetime.now(UTC) + timedelta(days=1))
    assert "administrator" in str(exc.value)


async def test_a_submitter_cannot_choose_who_submitted(login: Login, driver: Driver) -> None:
    """The priority class follows `submitted_by`, which any caller chose with --as:
    naming the release-verification identity bought class 0."""
    as_alice = await AsyncpgDriver.connect(login(roles.Kind.SUBMITTER, "alice"))
    try:
        answer = await producer.submit(
            as_alice, project="webapp", operation="unit", commit=SHA, submitted_by="release-bot"
        )
        rows = await driver.fetch(
            "SELECT submitted_by, priority_class FROM fleetq.jobs WHERE id = $1", answer.job_id
        )
        # release-bot's class is 0; alice's is not
        assert rows[0]["submitted_by"] == "alice" and rows[0]["priority_class"] > 0
        # its own jobs it may cancel; another's it may not
        await producer.cancel(as_alice, job_id=answer.job_id, actor="x", reason="mine")
        other = await _submit(driver, who="bob")
        with pytest.raises(FleetqError) as exc:
            await producer.cancel(as_alice, job_id=other, actor="alice", reason="not mine")
        _refused(exc)
        with pytest.raises(FleetqError):
            await as_alice.fetch("UPDATE fleetq.jobs SET priority_class = 0")
    finally:
        await as_alice.close()


async def test_an_operator_cannot_complete_and_a_reader_only_reads(
    login: Login, driver: Driver
) -> None:
    job = await _submit(driver)
    await fleet.runner(driver, "r2", node="node-b")
    (claim,) = await leasing.claim(driver, runner=RunnerId("node-b/r2"), lane="checks", limit=1)
    report = OutcomeReport(
        job_id=claim.job_id, lease_version=claim.lease_version, outcome=Outcome.SUCCEEDED
    )
    as_ops = await AsyncpgDriver.connect(login(roles.Kind.OPERATOR, "ops"))
    as_reader = await AsyncpgDriver.connect(login(roles.Kind.READER, "dashboard"))
    try:
        with pytest.raises(FleetqError) as exc:
            await leasing.complete(as_ops, runner=RunnerId("node-b/r2"), outcome=report)
        _refused(exc)
        # an operator's cancel is recorded under its own identity, whatever it claims
        await producer.cancel(as_ops, job_id=job, actor="someone-else", reason="ops")
        rows = await driver.fetch("SELECT cancelled_by FROM fleetq.jobs WHERE id = $1", job)
        assert rows[0]["cancelled_by"] == "ops"

        assert len(await as_reader.fetch("SELECT id FROM fleetq.jobs")) == 1
        with pytest.raises(FleetqError) as exc:
            await producer.cancel(as_reader, job_id=job, actor="dashboard", reason="x")
        _refused(exc)
        with pytest.raises(FleetqError) as exc:
            await as_reader.fetch("UPDATE fleetq.jobs SET state = 'queued'")
        _refused(exc)
        with pytest.raises(FleetqError) as exc:
            await as_reader.fetch("SELECT * FROM fleetq.logins")
        _refused(exc)
    finally:
        await as_ops.close()
        await as_reader.close()


@contextlib.contextmanager
def _plain_login(
    db_dsn: str, sync_conn: SyncConnection, prefix: str, options: str = ""
) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A connection as a login made by hand (`CREATE ROLE ... LOGIN <options>`), never
    added with `fleetq roles`; the role is dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    sync_conn.execute(f'CREATE ROLE "{name}" LOGIN {options}'.encode())
    sync_conn.commit()
    try:
        with psycopg.connect(login_dsn(db_dsn, name), autocommit=True) as conn:
            yield conn
    finally:
        sync_conn.execute(f'DROP ROLE "{name}"'.encode())
        sync_conn.commit()


def test_an_unknown_login_is_refused(db_dsn: str, sync_conn: SyncConnection) -> None:
    """A login that is neither a fleetq login nor an administrator can do nothing."""
    with _plain_login(db_dsn, sync_conn, "fq_stranger") as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM fleetq.claim('a/b', 'checks', 1, gen_random_uuid())")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM fleetq.jobs")


def test_a_member_of_a_fleetq_group_that_is_no_fleetq_login_is_refused(
    db_dsn: str, sync_conn: SyncConnection
) -> None:
    """The groups' grants let a call in; the login (fleetq.logins) says whom it acts as.
    A role an administrator granted a group by hand, never added with `fleetq roles`, has
    no identity: it may not act as an administrator (any runner, any submitter)."""
    with (
        _plain_login(db_dsn, sync_conn, "fq_member", "IN ROLE fleetq_runner") as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="not a fleetq login"),
    ):
        conn.execute("SELECT * FROM fleetq.claim('a/b', 'checks', 1, gen_random_uuid())")


def test_a_member_of_fleetq_owner_acts_as_an_administrator(
    db_dsn: str, sync_conn: SyncConnection
) -> None:
    """An administrator need not be a superuser: a member of fleetq_owner (the schema's
    owner) that is no fleetq login acts for any runner, as the operators' own tools do."""
    with _plain_login(db_dsn, sync_conn, "fq_owner", "NOSUPERUSER IN ROLE fleetq_owner") as conn:
        (kind,) = conn.execute("SELECT kind FROM fleetq.caller()").fetchone() or (None,)
        assert kind == "admin"
        acting = conn.execute("SELECT fleetq.acting_runner('node-x/anyone')").fetchone()
        assert acting == ("node-x/anyone",)


def test_add_writes_a_private_password_file_and_a_dsn_without_the_password(
    db_dsn: str, tmp_path: Path
) -> None:
    name = f"fq_runner_{uuid.uuid4().hex[:10]}"
    path = tmp_path / "r.pgpass"
    with connect(db_dsn) as conn:
        created = roles.add(
            conn, roles.Kind.RUNNER, "node-x/r", admin_dsn=db_dsn, password_file=path, login=name
        )
        conn.commit()
        try:
            assert path.stat().st_mode & 0o777 == 0o600
            line = path.read_text()
            password = line.strip().split(":")[-1]
            assert len(password) >= 24 and password not in created.dsn
            assert f"passfile={path.resolve()}" in created.dsn and name in created.dsn
            stored = conn.execute(
                b"SELECT rolpassword FROM pg_authid WHERE rolname = $1", [name]
            ).fetchone()
            assert stored is not None and str(stored[0]).startswith("SCRAM-SHA-256$")
            with pytest.raises(FleetqError):  # a second one with the same name
                roles.add(
                    conn,
                    roles.Kind.RUNNER,
                    "node-x/r",
                    admin_dsn=db_dsn,
                    password_file=tmp_path / "again.pgpass",
                    login=name,
                )
            with pytest.raises(FleetqError):
                roles.check_subject(roles.Kind.RUNNER, "no-slash")
        finally:
            roles.remove(conn, name)
            conn.commit()


async def test_a_reader_and_an_operator_can_read_what_the_console_and_cli_show(
    login: Login, driver: Driver
) -> None:
    """`fleetq-console --readonly` on a reader login, the operator's console, stats."""
    job = await _submit(driver)
    await fleet.runner(driver, "r2", node="node-b")
    for kind, subject in ((roles.Kind.READER, "dashboard"), (roles.Kind.OPERATOR, "ops")):
        reading = await AsyncpgDriver.connect(login(kind, subject))
        try:
            await views.overview(reading)
            await jobpages.job_page(reading, jobpages.JobFilter())
            detail = await views.job_detail(reading, job)
            assert detail.job.id == job
            await stats.stats(reading)
            await stats.overlaps(reading)
            assert [r.id for r in await fleet_api.runners(reading)] == ["node-b/r2"]
            await eligibility.explain(reading, job)
            await readers.events(reading, job_id=job)
        finally:
            await reading.close()


def test_the_cli_prints_a_dsn_and_never_the_password(
    db_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"fq_reader_{uuid.uuid4().hex[:10]}"
    path = tmp_path / "reader.pgpass"
    argv = ["--dsn", db_dsn, "roles", "add-reader", "dash", "--login", name]
    try:
        assert fleetq([*argv, "--password-file", str(path)]) == 0
        out = capsys.readouterr().out
        password = path.read_text().strip().split(":")[-1]
        assert password not in out and f"passfile={path.resolve()}" in out, out
        assert fleetq(["--dsn", db_dsn, "roles", "list"]) == 0
        assert name in capsys.readouterr().out
    finally:
        assert fleetq(["--dsn", db_dsn, "roles", "remove", name]) == 0
    assert fleetq(["--dsn", db_dsn, "roles", "remove", name]) == 65  # gone


def test_a_login_added_to_a_private_database_may_connect_to_it(
    login: Login, db_dsn: str, sync_conn: SyncConnection
) -> None:
    """Red before: on a database that keeps CONNECT from PUBLIC (the demo's) a reader
    added by `fleetq roles add-reader` was refused at once ("User does not have CONNECT
    privilege"); removing the login takes the grant with it."""
    (database,) = sync_conn.execute(b"SELECT current_database()").fetchone()  # type: ignore[misc]
    sync_conn.execute(f'REVOKE CONNECT ON DATABASE "{database}" FROM PUBLIC'.encode())
    sync_conn.commit()
    try:
        dsn = login(roles.Kind.READER, "watcher")
        with connect(dsn) as conn:
            assert conn.execute(b"SELECT current_user").fetchone() is not None
    finally:
        sync_conn.execute(f'GRANT CONNECT ON DATABASE "{database}" TO PUBLIC'.encode())
        sync_conn.commit()
