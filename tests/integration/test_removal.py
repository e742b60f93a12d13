"""Removing what is no longer wanted, keeping its history (issue 14): `fleetq config
remove operation P/O` retires an operation (refused while it has live jobs) and `fleetq
runners forget RUNNER` forgets an offline runner that holds nothing."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from fleetq.core import leasing, producer, removal, roles
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import AsyncpgDriver, Driver
from fleetq.core.errors import PermissionDenied, RefusedNow
from fleetq.core.models import Outcome, OutcomeReport
from tests import factories, fleet
from tests.e2e.conftest import wait_until
from tests.fleet import SHA
from tests.integration.conftest import Cli, Login


async def test_an_operation_with_live_jobs_is_kept_and_one_without_is_removed(
    cli: Cli, driver: Driver, tmp_path: Path
) -> None:
    job = await producer.submit(
        driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
    )
    code, _, err = cli("config", "remove", "operation", "tools/lint")
    assert code == 75 and "1 live job" in err  # refused for now: try again later
    runner = await fleet.runner(driver)
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    await leasing.complete(
        driver,
        runner=runner,
        outcome=OutcomeReport(
            job_id=claim.job_id, lease_version=claim.lease_version, outcome=Outcome.SUCCEEDED
        ),
    )

    code, out, _ = cli("config", "remove", "operation", "tools/lint")
    assert code == 0 and "removed; its 1 job(s)" in out
    code, out, _ = cli("config", "remove", "operation", "tools/lint")
    assert code == 0 and "already removed" in out  # idempotent

    # submits are refused, saying why; the history still answers
    code, _, err = cli("submit", "tools", "lint", "--commit", SHA)
    assert code == 65 and "tools/lint was removed" in err
    assert cli("result", "tools", SHA, "--operation", "lint")[0] == 0
    assert "[projects.tools.operations.lint]" not in cli("config", "show")[1]
    rows = await driver.fetch("SELECT state FROM fleetq.jobs WHERE id = $1", job.job_id)
    assert rows[0]["state"] == "succeeded"
    events = await driver.fetch("SELECT actor FROM fleetq.events WHERE kind = 'operation_removed'")
    assert len(events) == 1

    # unknown names and malformed arguments
    assert cli("config", "remove", "operation", "tools/nosuch")[0] == 65
    assert cli("config", "remove", "operation", "tools")[0] == 64


def test_applying_a_removed_operation_brings_it_back(cli: Cli, tmp_path: Path) -> None:
    assert cli("config", "remove", "operation", "tools/lint")[0] == 0
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[projects.tools]\nrepository = "repos/tools"\n'
        '[projects.tools.operations.lint]\nlane = "checks"\ncommand = "ruff check"\n'
    )
    assert "+ projects.tools.operations.lint (new)" in cli("config", "diff", str(path))[1]
    assert cli("apply", str(path))[0] == 0
    assert cli("submit", "tools", "lint", "--commit", SHA)[0] == 0


def test_a_submit_in_flight_is_never_left_with_a_removed_operation(
    db_dsn: str, sync_conn: SyncConnection
) -> None:
    """A submit that has read the operation but not yet inserted its job (here: its
    insert waits on another transaction's job with the same idempotency key) must either
    count as a live job for the removal or see the operation removed. Red without the
    KEY SHARE lock in submit: the removal went through while the submit waited, and a
    job of a removed operation was queued."""
    fleet.operations(sync_conn)
    factories.operation(sync_conn, "tools", "fmt")
    sync_conn.commit()
    call = "SELECT * FROM fleetq.submit('tools', $1, $2, NULL, 'k', NULL, 'a', NULL)"
    with connect(db_dsn) as first, connect(db_dsn) as second, connect(db_dsn) as third:
        first.execute(call, ["fmt", SHA])  # holds key 'k' of project tools, uncommitted
        pids = [int(c.execute("SELECT pg_backend_pid()").fetchone()[0]) for c in (second, third)]  # type: ignore[index]
        outcome: dict[str, object] = {}

        def submit() -> None:
            try:
                second.execute(call, ["lint", SHA])
                second.commit()
                outcome["submit"] = "queued"
            except Exception as exc:  # reported below, in the test's thread
                outcome["submit"] = exc

        def remove() -> None:
            try:
                third.execute(
                    "SELECT * FROM fleetq.retire_operation('tools', 'lint', 'ops')"
                ).fetchall()
                third.commit()
                outcome["remove"] = "removed"
            except Exception as exc:
                outcome["remove"] = exc

        submitter = threading.Thread(target=submit)
        submitter.start()
        wait_until(lambda: _waits_on_lock(sync_conn, pids[0]), what="the submit to wait")
        remover = threading.Thread(target=remove)
        remover.start()
        wait_until(
            lambda: "remove" in outcome or _waits_on_lock(sync_conn, pids[1]),
            what="the removal to finish or wait",
        )
        first.rollback()  # key 'k' is free: the waiting submit goes on
        submitter.join(10)
        remover.join(10)
    assert outcome["submit"] == "queued"
    assert isinstance(outcome["remove"], Exception) and "1 live job" in str(outcome["remove"])
    row = sync_conn.execute(
        "SELECT retired_at FROM fleetq.operations WHERE project = 'tools' AND name = 'lint'"
    ).fetchone()
    assert row == (None,)


def _waits_on_lock(conn: SyncConnection, pid: int) -> bool:
    row = conn.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", [pid]
    ).fetchone()
    conn.rollback()  # a fresh snapshot of pg_stat_activity each time
    return row is not None and row[0] == "Lock"


async def test_only_an_offline_runner_holding_nothing_is_forgotten(
    cli: Cli, driver: Driver
) -> None:
    runner = await fleet.runner(driver)
    await fleet.runner(driver, "r2", node="node-b")
    code, _, err = cli("runners", "forget", runner)
    assert code == 75 and "only an offline runner" in err
    job = await producer.submit(
        driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
    )
    await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    await _silence(driver, runner)
    code, _, err = cli("runners", "forget", runner)
    assert code == 75 and "still holds 1 job" in err  # the reaper's to recover first
    await driver.fetch(
        "UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() WHERE id = $1", job.job_id
    )
    await leasing.reap(driver)

    code, out, _ = cli("runners", "forget", runner)
    assert code == 0 and "forgotten" in out
    assert runner not in cli("runners")[1] and "node-b/r2" in cli("runners")[1]
    assert runner not in cli("explain", str(job.job_id))[1]
    assert cli("runners", "forget", "node-x/nosuch")[0] == 65
    # its history stays
    assert cli("events", "--runner", runner)[1].count("claimed") >= 1

    # heard from again (it registers), it is back
    await fleet.runner(driver)
    assert runner in cli("runners")[1]


async def test_forgetting_is_an_operators_lever(login: Login, driver: Driver) -> None:
    runner = await fleet.runner(driver, "r2", node="node-b")
    await _silence(driver, runner)
    as_reader = await AsyncpgDriver.connect(login(roles.Kind.READER, "dashboard"))
    as_ops = await AsyncpgDriver.connect(login(roles.Kind.OPERATOR, "ops"))
    try:
        with pytest.raises(PermissionDenied):
            await removal.forget_runner(as_reader, runner=runner, actor="dashboard")
        await removal.forget_runner(as_ops, runner=runner, actor="someone-else")
        assert runner not in {r["id"] for r in await as_reader.fetch(_LISTED)}
    finally:
        await as_reader.close()
        await as_ops.close()
    rows = await driver.fetch("SELECT forgotten_by FROM fleetq.runners WHERE id = $1", runner)
    assert rows[0]["forgotten_by"] == "ops"  # the login's identity, not the one claimed


_LISTED = (
    "SELECT id FROM fleetq.runners WHERE fleetq.runner_listed(forgotten_at, last_heartbeat_at)"
)


async def _silence(driver: Driver, runner: str) -> None:
    """The runner was last heard from an hour ago: offline."""
    await driver.fetch(
        "UPDATE fleetq.runners SET last_heartbeat_at = clock_timestamp() - interval '1 hour' "
        "WHERE id = $1",
        runner,
    )


async def test_a_refusal_is_a_typed_error(driver: Driver, sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)
    sync_conn.commit()
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="a")
    with pytest.raises(RefusedNow):
        await removal.remove_operation(driver, project="tools", operation="lint", actor="ops")
