"""A retry runs when its backoff ends (issue 42, finding 10): a retry was queued only by
the next reaper pass, so a 2 s backoff became the reap interval (5 s by default). Here
the interval is a minute: only the runner that recorded the failed attempt, running a
pass when the retry falls due, can bring the job back within the test's deadline."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from fleetq.core.db import connect
from tests.e2e.conftest import Repo, StartRunner, job_state, wait_until
from tests.e2e.test_runner import _submit

pytestmark = pytest.mark.slow

RETRY = {
    "max_attempts": 2,
    "backoff_seconds": 2,
    "backoff_max_seconds": 2,
    "on": ["exit"],
    "exit_codes": [],
}


def test_a_retry_runs_when_its_backoff_ends_not_at_the_next_reap(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: Path
) -> None:
    marker = tmp_path / "failed-once"
    script = (
        f"test -e {shlex.quote(str(marker))} || {{ touch {shlex.quote(str(marker))}; exit 3; }}"
    )
    config = tmp_path / "runner.toml"
    config.write_text("reap_interval_s = 60\n")
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute(
            b"UPDATE fleetq.operations SET command = $1, retry = $2::jsonb WHERE name = 'chatty'",
            [f"sh -c {shlex.quote(script)}", json.dumps(RETRY)],
        )
        start_runner(extra=("--config", str(config)))
        job = _submit(conn, "chatty", repo.head)
        wait_until(
            lambda: job_state(conn, job) == "succeeded",
            what="the retry to run and pass, long before the reap interval",
            deadline_s=30,
        )
        kinds = [
            r[0]
            for r in conn.execute(
                b"SELECT kind FROM fleetq.events WHERE job_id = $1 ORDER BY id", [job]
            ).fetchall()
        ]
        assert kinds.count("failed_attempt") == 1 and kinds.count("retrying") == 1, kinds
        (token,) = (
            conn.execute(b"SELECT lease_version FROM fleetq.jobs WHERE id = $1", [job]).fetchone()
            or ()
        )
        assert token == 2
