"""What `fleetq result` says of a commit, and its exit status (issue 42, findings 4 and 5):
a check that ran and failed is `failed` (1); one that could not run, for the fleet's
reasons, is `error` (3), never a red test; a refused job too (3); a cancelled job
decides nothing and never hides the verdict before it (2 when it is all there is)."""

from __future__ import annotations

import json

import pytest

from fleetq.core import leasing, producer
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver
from fleetq.core.models import JobId, Outcome, OutcomeReport, RunnerId
from tests import fleet
from tests.integration.conftest import Cli

COMMIT = "c" * 40


async def _ended(
    driver: Driver,
    runner: RunnerId,
    operation: str,
    outcome: Outcome,
    *,
    reason: str | None = None,
    exit_code: int | None = None,
) -> JobId:
    """A job of `tools`/`webapp` at COMMIT claimed and ended as told."""
    project = "tools" if operation == "lint" else "webapp"
    job = (
        await producer.submit(
            driver, project=project, operation=operation, commit=COMMIT, submitted_by="ci"
        )
    ).job_id
    lane = "control" if operation == "notify" else "checks"
    (claim,) = [
        c for c in await leasing.claim(driver, runner=runner, lane=lane, limit=8) if c.job_id == job
    ]
    report = OutcomeReport(
        job_id=job,
        lease_version=claim.lease_version,
        outcome=outcome,
        reason=reason,
        exit_code=exit_code,
    )
    await leasing.complete(driver, runner=runner, outcome=report)
    return job


def _result(cli: Cli, project: str, *extra: str) -> tuple[int, dict[str, dict[str, object]]]:
    code, out, err = cli("result", project, COMMIT, "--json", *extra)
    assert code in (0, 1, 2, 3), err
    return code, {a["operation"]: a for a in json.loads(out)}


@pytest.mark.parametrize(
    ("outcome", "reason", "exit_code", "word", "status"),
    [
        (Outcome.SUCCEEDED, None, 0, "passed", 0),
        (Outcome.FAILED, None, 1, "failed", 1),  # a red test
        (Outcome.FAILED, "timeout", None, "failed", 1),
        (Outcome.FAILED, "launch failed: cannot run pytset: No such file", None, "error", 3),
        (
            Outcome.FAILED,
            "staging failed: cannot fetch /r: fatal: not a git repo",
            None,
            "error",
            3,
        ),
        (Outcome.FAILED, "runner error: OSError: disk full", None, "error", 3),
        (Outcome.REFUSED, "commit cccc is not in /r", None, "refused", 3),
    ],
)
async def test_a_verdict_says_whether_the_check_ran(
    driver: Driver,
    sync_conn: SyncConnection,
    cli: Cli,
    outcome: Outcome,
    reason: str | None,
    exit_code: int | None,
    word: str,
    status: int,
) -> None:
    runner = await fleet.runner(driver, capabilities=("browser",))
    await _ended(driver, runner, "lint", outcome, reason=reason, exit_code=exit_code)
    code, answers = _result(cli, "tools")
    assert (code, answers["lint"]["status"]) == (status, word)
    assert answers["lint"]["reason"] == (reason if reason or word == "passed" else "exit")


async def test_a_cancel_never_hides_a_verdict(
    driver: Driver, sync_conn: SyncConnection, cli: Cli
) -> None:
    """A commit passed (job A), then a job of the same check was cancelled: `result`
    said `cancelled`, exit 1, reason null."""
    runner = await fleet.runner(driver, capabilities=("browser",))
    passed = await _ended(driver, runner, "lint", Outcome.SUCCEEDED, exit_code=0)
    again = (
        await producer.submit(
            driver, project="tools", operation="lint", commit=COMMIT, submitted_by="ci"
        )
    ).job_id
    code, answers = _result(cli, "tools")
    assert code == 0 and answers["lint"]["newer_state"] == "queued"
    assert cli("cancel", str(again), "--reason", "superseded by a push")[0] == 0
    code, answers = _result(cli, "tools")
    lint = answers["lint"]
    assert code == 0 and (lint["status"], lint["job_id"]) == ("passed", passed)
    assert (lint["newer_job_id"], lint["newer_state"]) == (again, "cancelled")
    code, out, _ = cli("result", "tools", COMMIT)
    assert f"{again} cancelled" in out and "passed" in out
    # with nothing decided before it, a cancel is all there is: not decided, with its reason
    only = (
        await producer.submit(
            driver, project="webapp", operation="unit", commit=COMMIT, submitted_by="ci"
        )
    ).job_id
    cli("cancel", str(only), "--reason", "wrong branch")
    code, answers = _result(cli, "webapp")
    assert code == 2 and answers["unit"]["status"] == "cancelled"
    assert answers["unit"]["reason"] == "wrong branch"


async def test_a_failure_outweighs_an_error_and_an_error_a_pending_check(
    driver: Driver, sync_conn: SyncConnection, cli: Cli
) -> None:
    runner = await fleet.runner(driver, capabilities=("browser",))
    await _ended(driver, runner, "unit", Outcome.FAILED, reason="lost")
    await producer.submit(
        driver, project="webapp", operation="browser", commit=COMMIT, submitted_by="ci"
    )
    code, answers = _result(cli, "webapp")
    assert code == 3 and answers["unit"]["status"] == "error"  # lost with its runner
    await _ended(driver, runner, "notify", Outcome.FAILED, exit_code=2)
    assert _result(cli, "webapp")[0] == 1


async def test_jobs_shows_who_ran_a_finished_job_and_for_how_long(
    driver: Driver, sync_conn: SyncConnection, cli: Cli
) -> None:
    """`fleetq jobs` showed no runner and no duration once a job had finished (issue 42,
    finding 10)."""
    runner = await fleet.runner(driver, capabilities=("browser",))
    job = await _ended(driver, runner, "lint", Outcome.SUCCEEDED, exit_code=0)
    sync_conn.execute(
        b"UPDATE fleetq.jobs SET started_at = finished_at - interval '75 seconds' WHERE id = $1",
        [job],
    )
    sync_conn.commit()
    code, out, _ = cli("jobs")
    (line,) = [row for row in out.splitlines() if row.startswith(f"{job} ")]
    assert code == 0 and runner in line and " 1m" in line, out
