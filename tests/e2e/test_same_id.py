"""One runner id, two processes (issue 43): the hand-over never reports a live
predecessor's run lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleetq.core.db import SyncConnection, connect
from tests.e2e.conftest import ROOT, Repo, RunnerProcess, StartRunner, job_state, wait_until
from tests.e2e.test_runner import _row, _submit

pytestmark = pytest.mark.slow

_ID_HELD = (
    "SELECT count(*) FROM fleetq.coordination c JOIN pg_stat_activity a ON a.pid = c.holder_pid "
    "WHERE c.name = 'runner:' || $1"
)


def _counters(conn: SyncConnection, job: int) -> tuple[object, ...]:
    return _row(
        conn,
        "SELECT state, lost_count, reassign_count, lease_version FROM fleetq.jobs WHERE id = $1",
        job,
    )


def _end_sessions(conn: SyncConnection) -> None:
    """End every runner session, as an operator (or a server's keepalives) would: the
    runner id's lock goes with its LISTEN session."""
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
        "current_database() AND application_name LIKE 'fleetq-runner%'"
    )


def _successor(dsn: str, tmp_path: Path, work: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """A second process of runner node-a/r, not waited for (it may be refused)."""
    log = tmp_path / "successor.log"
    argv = [
        sys.executable,
        "-m",
        "fleetq.runner",
        *("--dsn", dsn, "--node", "node-a", "--name", "r", "--work-dir", str(work)),
        *("--poll", "0.2", "--lane", "checks=2", "--lane", "control=3"),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    return proc, log


def test_a_frozen_runner_keeps_its_id_and_its_run(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: Path
) -> None:
    """Runner A frozen (SIGSTOP) with its database sessions ended; B starts as the same
    runner in the same directory. B took the id, swept A's healthy run and reported it
    lost (twice: the job failed `lost`). Now B is refused while A lives, and A's run
    ends under its own token once A goes on."""
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute("UPDATE fleetq.operations SET command = 'sleep 6' WHERE name = 'sleep'")
        a = start_runner()
        job = _submit(conn, "sleep", repo.head)
        wait_until(lambda: job_state(conn, job) == "running", what="A to run the job")
        a.signal(signal.SIGSTOP)
        try:
            _end_sessions(conn)
            wait_until(
                lambda: _row(conn, _ID_HELD, a.runner_id) == (0,),
                what="A's LISTEN session, and its lock on the runner id, to be gone",
            )
            b, log = _successor(fleet_dsn, tmp_path, tmp_path / "work")
            try:
                wait_until(
                    lambda: b.poll() is not None or " serving " in log.read_text(),
                    what="B to be refused (or to serve)",
                    deadline_s=60,
                )
            finally:
                if b.poll() is None:  # not refused: do not leave it running
                    b.kill()
                    b.wait()
            said = log.read_text()
            assert b.returncode == 1, (_counters(conn, job), said)
            assert "already served by another process" in said, said
            assert "stopped" in said, said  # says why A does not answer
            assert _counters(conn, job) == ("running", 0, 0, 1)
        finally:
            a.signal(signal.SIGCONT)
        wait_until(
            lambda: job_state(conn, job) == "succeeded",
            what="A's run to end",
            show=a.output,
        )
        assert _counters(conn, job) == ("succeeded", 0, 0, 1)
        assert "LISTEN connection re-established" in a.output()


def _held_by(conn: SyncConnection, runner: RunnerProcess, job: int, *, claimed_ago: str) -> None:
    """Make the database say `runner`'s id claimed `job` (control lane), with an hour of
    lease left, as a live holder that keeps renewing it would have."""
    conn.execute(
        "UPDATE fleetq.jobs SET state = 'claimed', lease_owner = $1, reserved_on = $1, "
        "lease_version = 1, claim_id = gen_random_uuid(), "
        f"claimed_at = clock_timestamp() - interval '{claimed_ago}', "
        "lease_expires_at = clock_timestamp() + interval '1 hour' WHERE id = $2",
        [runner.runner_id, job],
    )
    conn.execute(
        "UPDATE fleetq.runner_lanes SET slots_used = slots_used + 1 WHERE lane = 'control'"
    )


def test_a_lease_whose_holder_is_not_proven_dead_is_left_to_run_out(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: Path
) -> None:
    """A runner of this id in another directory (another node with the same name, or
    another --work-dir) leaves no evidence here: its leases are neither reported lost at
    start-up nor taken for strays; they end by their holder or by expiring (requeued by
    the reaper, counted as a reassignment, not a loss)."""
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute("UPDATE fleetq.settings SET value = '2' WHERE name = 'lease_seconds'")
        first = start_runner(lanes=("checks=2", "control=3"))  # registers node-a/r
        conn.execute("UPDATE fleetq.runners SET state = 'paused'")
        held = _submit(conn, "ping", repo.head)
        _held_by(conn, first, held, claimed_ago="1 minute")
        first.signal(signal.SIGKILL)
        first.wait()
        conn.execute("UPDATE fleetq.runners SET state = 'active'")
        _end_sessions(conn)  # a killed process's backends may linger
        second = start_runner(
            lanes=("checks=2", "control=3"), extra=("--work-dir", str(tmp_path / "elsewhere"))
        )
        assert _counters(conn, held) == ("claimed", 0, 0, 1)
        assert f"job={held} token=1 is held by this runner id" in second.output()
        # a stray of this process's own: the strays pass settles it, and by then it has
        # looked at the held job too
        conn.execute("UPDATE fleetq.runners SET state = 'paused'")
        stray = _submit(conn, "ping", repo.head)
        _held_by(conn, second, stray, claimed_ago="1 minute")
        conn.execute("UPDATE fleetq.runners SET state = 'active'")
        wait_until(
            lambda: job_state(conn, stray) == "succeeded",
            what="the strays pass to settle this process's own stray",
            show=second.output,
        )
        assert _counters(conn, held) == ("claimed", 0, 0, 1)
        conn.execute(
            "UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() - interval '1 second' "
            "WHERE id = $1",
            [held],
        )
        wait_until(
            lambda: job_state(conn, held) == "succeeded",
            what="the expired lease to be requeued and the job run",
            show=second.output,
        )
        assert _counters(conn, held) == ("succeeded", 0, 1, 2)
