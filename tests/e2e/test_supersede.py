"""A runner frozen past its lease (SIGSTOP) is superseded; the overlap is measured."""

from __future__ import annotations

import contextlib
import io
import json
import signal
from typing import Any

import pytest

from fleetq.cli.main import main
from fleetq.core.db import SyncConnection, connect
from tests.e2e.conftest import Repo, StartRunner, job_state, wait_until
from tests.e2e.test_runner import _row, _submit

pytestmark = pytest.mark.slow


def _expired(conn: SyncConnection, job: int) -> bool:
    row = conn.execute(
        "SELECT lease_expires_at < clock_timestamp() FROM fleetq.jobs WHERE id = $1", [job]
    ).fetchone()
    return bool(row and row[0])


def test_sigstop_past_the_lease_is_superseded_and_the_overlap_measured(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute("UPDATE fleetq.settings SET value = '2' WHERE name = 'lease_seconds'")
        # long enough to outlive a's freeze: a stops it when it thaws, and dates that end
        # (a run that ended during the freeze has an end a did not see: bounded)
        conn.execute("UPDATE fleetq.operations SET command = 'sleep 10' WHERE name = 'sleep'")
        job = _submit(conn, "sleep", repo.head)
        a = start_runner("node-a")
        wait_until(lambda: job_state(conn, job) == "running", what="runner a to start the job")
        a.signal(signal.SIGSTOP)
        try:
            wait_until(lambda: _expired(conn, job), what="a's lease to expire")
            assert main(["--dsn", fleet_dsn, "reap"]) == 0
            start_runner("node-b")
            wait_until(
                lambda: (
                    _row(conn, "SELECT lease_version, state FROM fleetq.jobs WHERE id = $1", job)
                    == (2, "running")
                ),
                what="runner b to start the job under token 2",
            )
        finally:
            a.signal(signal.SIGCONT)
        wait_until(
            lambda: _row(
                conn,
                "SELECT stop_confirmed FROM fleetq.executions WHERE "
                "job_id = $1 AND lease_version = 1",
                job,
            )[0],
            what="a to stop its superseded execution",
        )
        wait_until(lambda: job_state(conn, job) == "succeeded", what="b's outcome")
        (reason,) = _row(
            conn,
            "SELECT stop_reason FROM fleetq.executions WHERE job_id = $1 AND lease_version = 1",
            job,
        )
        assert reason == "superseded"
        outcomes = conn.execute(
            "SELECT runner_id, lease_version FROM fleetq.events WHERE "
            "job_id = $1 AND kind IN ('succeeded', 'failed')",
            [job],
        ).fetchall()
        assert outcomes == [("node-b/r", 2)]  # only the newer token's outcome committed
    window = _cli_json(fleet_dsn, "overlaps")[0]
    assert (window["job_id"], window["older_token"], window["newer_token"]) == (job, 1, 2)
    assert window["end_confirmed"] and not window["open"] and window["ended_at"]
    figures = _cli_json(fleet_dsn, "stats")
    assert figures["duplicate_execution_incidents"] == 1
    assert (figures["recovery"]["incidents"], figures["recovery"]["recovered"]) == (1, 1)
    print(
        f"overlap window {window['started_at']} -> {window['ended_at']}; "
        f"recovery delay {figures['recovery']['max_s']:.3f}s"
    )


def _cli_json(dsn: str, *args: str) -> Any:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--dsn", dsn, *args, "--json"]) == 0
    return json.loads(out.getvalue())


def test_a_runner_that_claims_back_its_own_superseded_job_runs_it_once_more(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    """Frozen past its lease with no other runner about, a runner resumes and claims the
    requeued job itself while its older run of it is still stopping: the older run is
    superseded, the newer one is tracked as running (not reported lost as "held but not
    running" when the older one ends) and its outcome commits."""
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute("UPDATE fleetq.settings SET value = '2' WHERE name = 'lease_seconds'")
        conn.execute("UPDATE fleetq.operations SET command = 'sleep 3' WHERE name = 'sleep'")
        job = _submit(conn, "sleep", repo.head)
        a = start_runner("node-a")
        wait_until(lambda: job_state(conn, job) == "running", what="runner a to start the job")
        a.signal(signal.SIGSTOP)
        try:
            wait_until(lambda: _expired(conn, job), what="a's lease to expire")
            assert main(["--dsn", fleet_dsn, "reap"]) == 0
        finally:
            a.signal(signal.SIGCONT)
        wait_until(lambda: job_state(conn, job) == "succeeded", what="the job's outcome")
        kinds = [
            row[0]
            for row in conn.execute(
                "SELECT kind FROM fleetq.events WHERE job_id = $1 ORDER BY id", [job]
            ).fetchall()
        ]
        runs = conn.execute(
            "SELECT lease_version, stop_reason, exit_code FROM fleetq.executions "
            "WHERE job_id = $1 ORDER BY lease_version",
            [job],
        ).fetchall()
    assert "lost" not in kinds, kinds
    assert runs == [(1, "superseded", None), (2, None, 0)], runs
    assert a.proc.poll() is None, a.output()
