"""Resource limits per operation (issue 13): setrlimit on each process of a command job,
and a job that passes one ends failed with the limit named, not a bare signal."""

from __future__ import annotations

import pytest

from fleetq.core.db import connect
from tests.e2e.conftest import Repo, StartRunner, job_state, wait_until
from tests.e2e.test_runner import _submit

pytestmark = pytest.mark.slow


def test_limits_per_operation_end_a_job_that_passes_them_and_say_which(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    """An operation's `limits` (setrlimit on each of its processes): a job writing past
    `output_mb` or spinning past `cpu_seconds` ends failed, the limit named."""
    start_runner()
    with connect(fleet_dsn, autocommit=True) as conn:
        flood = _submit(conn, "flood", repo.head)
        spin = _submit(conn, "spin", repo.head)
        wait_until(
            lambda: job_state(conn, flood) == job_state(conn, spin) == "failed",
            what="both jobs to fail",
        )
        reasons = dict(
            conn.execute(
                b"SELECT id, failure_reason FROM fleetq.jobs WHERE id = ANY($1)", [[flood, spin]]
            ).fetchall()
        )
    assert reasons[flood].startswith("output limit"), reasons
    assert reasons[spin].startswith("cpu limit"), reasons
