"""Job output from any machine (issue 14): the runner ships a command job's output to
the database as it runs, so `fleetq logs JOB --follow` shows it live and ends with the
job; control sequences arrive escaped; a run keeps its head and its newest
output_keep_kib, and a cancelled run keeps what it had printed. Before, output lived only in log
files on the runner's node."""

from __future__ import annotations

import os
import re
import shlex
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


WRITER = """import sys, time
size, pause = int(sys.argv[1]), float(sys.argv[2])
out = sys.stdout.buffer
out.write(b"first line\\n")
written, lines = 11, 0
while written < size:
    out.write(b"x" * 999 + b"\\n")
    written, lines = written + 1000, lines + 1
    if pause and lines % 1000 == 0:
        out.flush()
        time.sleep(pause)
out.write(b"last line %d\\n" % written)
"""


@pytest.mark.parametrize(
    ("size", "pause"),
    [(2_000_000, 0.0), (10_000_000, 0.0), (50_000_000, 0.2)],
    ids=["2MB", "10MB", "slow-50MB"],
)
def test_a_run_keeps_its_head_and_its_last_line(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, size: int, pause: float
) -> None:
    """Past output_keep_kib the database held the run's oldest output and the runner never
    shipped its end: a check's summary (its last lines) was lost, and a slow 50 MB job kept
    one block of 50 (issue 42, finding 3). Now the head and the newest bytes are kept, and
    what `fleetq logs` prints plus the bytes it says were dropped is the whole output."""
    command = f"python3 -c {shlex.quote(WRITER)} {size} {pause}"
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute(b"UPDATE fleetq.operations SET command = $1 WHERE name = 'chatty'", [command])
        start_runner()
        job = _submit(conn, "chatty", repo.head)
        wait_until(lambda: job_state(conn, job) == "succeeded", what="the job", deadline_s=120)
        stored = conn.execute(
            b"SELECT sum(octet_length(data)) FROM fleetq.job_output WHERE job_id = $1", [job]
        ).fetchone()
    written = 11 + 1000 * -(-(size - 11) // 1000)
    last = f"last line {written}\n"
    out, err = _logs(fleet_dsn, str(job)).communicate(timeout=60)
    assert out.startswith("first line\n") and out.endswith(last), (out[:80], out[-80:])
    dropped = sum(int(n.replace(",", "")) for n in re.findall(r"── ([\d,]+) bytes of output", err))
    assert len(out) + dropped == written + len(last), err
    assert stored is not None and stored[0] == len(out) <= 64 * 1024 + 1024 * 1024


def test_a_cancelled_run_keeps_its_own_output(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute(b"UPDATE fleetq.operations SET command = $1 WHERE name = 'chatty'", [CHATTY])
        start_runner()
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
    out, _ = _logs(fleet_dsn, str(chatty)).communicate(timeout=30)
    assert out.startswith("line 1 ") and "line 6" not in out, out
