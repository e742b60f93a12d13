"""Job output from any machine (issue 14): the runner ships a command job's output to
the database as it runs, so `fleetq logs JOB --follow` shows it live and ends with the
job; control sequences arrive escaped; only the newest output_keep_kib of a run are
kept, and a cancelled run keeps what it had printed. Before, output lived only in log
files on the runner's node."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fleetq.core.db import connect
from tests.e2e.conftest import ROOT, Repo, StartRunner, job_state, wait_until
from tests.e2e.test_runner import _submit

pytestmark = pytest.mark.slow

CHATTY = (
    "python3 -u -c 'import time\n"
    "for i in range(1, 7):\n"
    '    print("line", i, chr(27) + "[31mred" + chr(27) + "[0m")\n'
    "    time.sleep(0.4)\n'"
)


def _logs(dsn: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fleetq", "--dsn", dsn, "logs", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_follow_shows_output_as_it_comes_and_ends_with_the_job(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute(b"UPDATE fleetq.operations SET command = $1 WHERE name = 'chatty'", [CHATTY])
        start_runner()
        job = _submit(conn, "chatty", repo.head)
        wait_until(lambda: job_state(conn, job) == "running", what="the job to run")
        follower = _logs(fleet_dsn, str(job), "--follow")
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 0, err
        assert job_state(conn, job) == "succeeded"
    lines = out.splitlines()
    assert lines == [f"line {i} \\x1b[31mred\\x1b[0m" for i in range(1, 7)], out
    assert "\x1b" not in out and "run under token 1" in err
    again = _logs(fleet_dsn, str(job))
    assert again.communicate(timeout=30)[0] == out  # after the fact: the same


def test_only_the_newest_output_is_kept_and_a_cancelled_run_keeps_its_own(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute(b"UPDATE fleetq.settings SET value = '64' WHERE name = 'output_keep_kib'")
        conn.execute(b"UPDATE fleetq.operations SET command = $1 WHERE name = 'chatty'", [CHATTY])
        start_runner()
        bulky = _submit(conn, "bulky", repo.head)
        wait_until(lambda: job_state(conn, bulky) == "succeeded", what="the bulky job")
        kept = conn.execute(
            b"SELECT sum(octet_length(data)), min(seq) FROM fleetq.job_output WHERE job_id = $1",
            [bulky],
        ).fetchone()
        assert kept is not None and kept[0] <= 64 * 1024 and kept[1] > 0, kept
        chatty = _submit(conn, "chatty", repo.head)
        wait_until(
            lambda: (
                (
                    conn.execute(
                        b"SELECT count(*) FROM fleetq.job_output WHERE job_id = $1", [chatty]
                    ).fetchone()
                    or (0,)
                )[0]
                >= 2
            ),
            what="two chunks of output",
        )
        conn.execute(b"SELECT * FROM fleetq.cancel($1, 'ops', 'enough')", [chatty])
    out, err = _logs(fleet_dsn, str(bulky)).communicate(timeout=30)
    assert "earlier output dropped" in err and out.rstrip("\n").endswith("x" * 1000)
    out, _ = _logs(fleet_dsn, str(chatty)).communicate(timeout=30)
    assert out.startswith("line 1 ") and "line 6" not in out, out
