"""A verdict's provenance in the database (issue 47): stored only with an outcome the
fence accepted, its environment and definition kept once however many verdicts share
them, a bad one refused without losing the outcome, and read back whole by `result`
and compared by `--diff`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleetq.console.views.detail import head_text
from fleetq.core import leasing, producer, views
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver
from fleetq.core.errors import StaleLease
from fleetq.core.models import JobId, Outcome, OutcomeReport, RunnerId
from tests import fleet
from tests.integration.conftest import Cli

COMMIT = "c" * 40


def _facts(python: str = "Python 3.11.2", runner: str = "node-a/r") -> dict[str, Any]:
    return {
        "environment": {"runner": runner, "node": "node-a", "tools": {"python3 -V": python}},
        "definition": {"command": "pytest", "timeout_s": 60},
        "staging": {"mirror": "warm", "tree": "ab" * 20},
        "lockfiles": {"uv.lock": "sha256:" + "0" * 64},
        "tests": {"passed": 901, "failed": 0, "skipped": 3, "reports": 1},
    }


async def _claimed(driver: Driver, runner: RunnerId) -> tuple[int, int]:
    job = (
        await producer.submit(
            driver, project="tools", operation="lint", commit=COMMIT, submitted_by="ci"
        )
    ).job_id
    (claim,) = [
        c
        for c in await leasing.claim(driver, runner=runner, lane="checks", limit=8)
        if c.job_id == job
    ]
    return job, claim.lease_version


def _report(job: int, token: int, facts: dict[str, Any] | None) -> OutcomeReport:
    return OutcomeReport(
        job_id=job, lease_version=token, outcome=Outcome.SUCCEEDED, exit_code=0, provenance=facts
    )


def _counts(conn: SyncConnection) -> tuple[int, int]:
    parts = conn.execute(b"SELECT count(*) FROM fleetq.provenance_parts").fetchone()
    kept = conn.execute(
        b"SELECT count(*) FROM fleetq.verdicts WHERE provenance IS NOT NULL"
    ).fetchone()
    assert parts is not None and kept is not None
    return parts[0], kept[0]


async def test_only_the_fenced_outcome_keeps_its_provenance_and_parts_are_shared(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver, capabilities=("browser",))
    job, token = await _claimed(driver, runner)
    # a zombie's outcome (an older token) keeps nothing, not even a part
    with pytest.raises(StaleLease):
        await leasing.complete(driver, runner=runner, outcome=_report(job, token - 1, _facts()))
    assert _counts(sync_conn) == (0, 0)
    await leasing.complete(driver, runner=runner, outcome=_report(job, token, _facts()))
    assert _counts(sync_conn) == (2, 1)  # one environment, one definition
    for _ in range(3):  # the same runner's next verdicts: no row more than the verdict's
        job, token = await _claimed(driver, runner)
        await leasing.complete(driver, runner=runner, outcome=_report(job, token, _facts()))
    assert _counts(sync_conn) == (2, 4)
    job, token = await _claimed(driver, runner)
    await leasing.complete(
        driver, runner=runner, outcome=_report(job, token, _facts(python="Python 3.12.1"))
    )
    assert _counts(sync_conn) == (3, 5)  # another Python: one environment more


async def test_a_bad_provenance_is_not_kept_and_the_outcome_is(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver, capabilities=("browser",))
    for facts in ({"environment": {"blob": "x" * 70_000}}, None):
        job, token = await _claimed(driver, runner)
        await leasing.complete(driver, runner=runner, outcome=_report(job, token, facts))
        row = sync_conn.execute(
            "SELECT verdict, provenance FROM fleetq.verdicts WHERE job_id = $1", [job]
        ).fetchone()
        assert row is not None and row[0] == "passed"
        if facts is None:
            assert row[1] is None
        else:
            assert "dropped" in row[1], row
    # not an object: the database refuses to keep it, the outcome stands
    job, token = await _claimed(driver, runner)
    await driver.fetch(
        "SELECT * FROM fleetq.complete($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        runner,
        [job],
        [token],
        ["succeeded"],
        [0],
        [None],
        [""],
        [None],
        [None],
        [None],
        [json.dumps([1, 2])],
    )
    row = sync_conn.execute(
        "SELECT verdict, provenance FROM fleetq.verdicts WHERE job_id = $1", [job]
    ).fetchone()
    assert row is not None and row[0] == "passed" and "dropped" in row[1]
    assert _counts(sync_conn)[0] == 0


async def test_result_shows_tests_and_diff_names_what_differed(
    driver: Driver, sync_conn: SyncConnection, cli: Cli
) -> None:
    a = await fleet.runner(driver, capabilities=("browser",))
    first, token = await _claimed(driver, a)
    await leasing.complete(driver, runner=a, outcome=_report(first, token, _facts()))
    second, token = await _claimed(driver, a)
    changed = _facts(python="Python 3.12.1", runner="node-b/r")
    await leasing.complete(driver, runner=a, outcome=_report(second, token, changed))

    code, out, _ = cli("result", "tools", COMMIT)
    assert code == 0 and "901 passed, 0 failed, 3 skipped" in out, out
    _, out, _ = cli("-v", "result", "tools", COMMIT)
    assert "tool: python3 -V → Python 3.12.1" in out and "lockfile: uv.lock" in out, out

    code, out, _ = cli("result", "tools", COMMIT, "--diff", str(first))
    assert code == 0, out
    assert "environment.tools.python3 -V: Python 3.12.1 → Python 3.11.2" in out, out
    assert "environment.runner: node-b/r → node-a/r" in out, out
    assert "lockfiles" not in out and "definition" not in out, out  # the same: not named
    code, out, _ = cli("result", "tools", COMMIT, "--diff", str(second), "--json")
    (same,) = json.loads(out)
    assert same["differences"] == [] and same["other_job"] == second


async def test_a_test_that_failed_then_passed_at_one_commit_is_flaky(
    driver: Driver, sync_conn: SyncConnection, cli: Cli
) -> None:
    runner = await fleet.runner(driver, capabilities=("browser",))
    red = _facts()
    red["tests"] = {"passed": 900, "failed": 1, "skipped": 3, "reports": 1, "failing": ["t::a"]}
    job, token = await _claimed(driver, runner)
    first = job
    failed = OutcomeReport(
        job_id=job, lease_version=token, outcome=Outcome.FAILED, exit_code=1, provenance=red
    )
    await leasing.complete(driver, runner=runner, outcome=failed)
    code, out, _ = cli("stats")
    assert code == 0 and "flaky" not in out, out  # failed only: a red test, not flaky
    job, token = await _claimed(driver, runner)
    await leasing.complete(driver, runner=runner, outcome=_report(job, token, _facts()))
    _, out, _ = cli("stats", "--json")
    (flaky,) = json.loads(out)["flaky"]
    assert (flaky["project"], flaky["operation"], flaky["test"], flaky["commits"]) == (
        "tools",
        "lint",
        "t::a",
        1,
    )
    _, out, _ = cli("stats")
    assert "flaky tests (failed, then passed at the same commit)" in out and "t::a" in out
    # the console's job detail flags it, on either verdict of the check
    for shown in (first, job):
        detail = await views.job_detail(driver, JobId(shown))
        assert detail.flaky == ["t::a"], detail.flaky
        head = head_text(detail, detail.now).plain
        assert "flaky at this commit: t::a (failed, then passed)" in head, head


async def test_provenance_of_another_shape_is_read_without_failing_the_reader(
    driver: Driver, sync_conn: SyncConnection, cli: Cli
) -> None:
    """A runner of another version, or a wrong one, may send any JSON object: the
    readers (result -v, stats, the console) leave out what they cannot read."""
    runner = await fleet.runner(driver, capabilities=("browser",))
    odd = {
        "environment": {"tools": ["not", "a", "map"], "runner": 7},
        "steps": {"names": "lint", "sha256": 12},
        "lockfiles": "uv.lock",
        "tests": {"reports": "many", "failing": {"t": 1}, "unreadable": 3},
    }
    job, token = await _claimed(driver, runner)
    red = {**odd, "tests": {"failing": [None, 7, {"t": 1}, "t::odd"], "unreadable": 3}}
    failed = OutcomeReport(
        job_id=job, lease_version=token, outcome=Outcome.FAILED, exit_code=1, provenance=red
    )
    await leasing.complete(driver, runner=runner, outcome=failed)
    later, token = await _claimed(driver, runner)
    await leasing.complete(driver, runner=runner, outcome=_report(later, token, odd))
    code, out, err = cli("-v", "result", "tools", COMMIT)
    assert code == 0 and "runner: 7 on ?" in out, out + err
    code, out, err = cli("stats")
    assert code == 0 and "flaky" not in out, out + err  # "many" reports are no count
    passed = {**odd, "tests": {"reports": 1}}
    again, token = await _claimed(driver, runner)
    await leasing.complete(driver, runner=runner, outcome=_report(again, token, passed))
    code, out, err = cli("stats", "--json")
    flaky = [(f["test"], f["commits"]) for f in json.loads(out)["flaky"]]
    assert code == 0 and flaky == [("t::odd", 1)], out + err  # only the names that are names
    detail = await views.job_detail(driver, JobId(job))
    assert detail.flaky == ["t::odd"] and "runner: 7" in head_text(detail, detail.now).plain
