"""A real runner's verdicts when the check cannot run (issue 42, finding 5): a command
the node does not have and a repository that cannot be fetched are `error` (exit 3),
a commit the repository lacks is `refused` (exit 3); a red test stays `failed` (1)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fleetq.core.db import connect
from tests.e2e.conftest import ROOT, Repo, StartRunner, job_state, wait_until
from tests.e2e.test_runner import _submit

pytestmark = pytest.mark.slow


def _result(dsn: str, commit: str, operation: str = "check") -> tuple[int, str]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetq",
            "--dsn",
            dsn,
            "result",
            "repo",
            commit,
            "--operation",
            operation,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout


def test_a_check_that_could_not_run_is_an_error_not_a_failure(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute(
            b"UPDATE fleetq.operations SET command = 'fleetq-no-such-program --x' "
            b"WHERE name = 'chatty'"
        )
        runner = start_runner()
        red = _submit(conn, "check", repo.head)  # check.py exits 9 at head: a red test
        wait_until(lambda: job_state(conn, red) == "failed", what="the red test")
        assert _result(fleet_dsn, repo.head)[0] == 1

        missing = _submit(conn, "chatty", repo.old)
        wait_until(
            lambda: job_state(conn, missing) == "failed",
            what="the launch to fail",
            show=lambda: f"state {job_state(conn, missing)}\n{runner.output()[-3000:]}",
        )
        code, out = _result(fleet_dsn, repo.old, "chatty")
        assert code == 3 and "error" in out and "fleetq-no-such-program" in out, out

        absent = "d" * 40
        gone = _submit(conn, "check", absent)
        wait_until(lambda: job_state(conn, gone) == "refused", what="the refusal")
        code, out = _result(fleet_dsn, absent)
        assert code == 3 and "refused" in out and "is not in" in out, out


def test_a_repository_that_cannot_be_fetched_is_an_error(
    fleet_dsn: str, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute(b"UPDATE fleetq.projects SET repository = '/nonexistent/fleetq-repo'")
        start_runner()
        unfetched = "e" * 40
        job = _submit(conn, "check", unfetched)
        wait_until(lambda: job_state(conn, job) == "failed", what="staging to fail")
    code, out = _result(fleet_dsn, unfetched)
    assert code == 3 and "error" in out and "staging failed" in out, out
