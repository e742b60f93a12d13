"""fleetq-runner end to end: real processes, real database, real git."""

from __future__ import annotations

import signal
from pathlib import Path

import psutil

from fleetq.core import producer
from fleetq.core.db import SyncConnection, connect
from tests.e2e.conftest import Repo, StartRunner, job_state, wait_until


def _submit(
    conn: SyncConnection,
    operation: str,
    commit: str,
    *,
    requested_node: str | None = None,
    payload: dict[str, object] | None = None,
) -> int:
    return producer.submit_in_transaction(
        conn,
        project="repo",
        operation=operation,
        commit=commit,
        submitted_by="tests",
        requested_node=requested_node,
        payload=payload,
    ).job_id


def _row(conn: SyncConnection, sql: str, *params: object) -> tuple[object, ...]:
    row = conn.execute(sql.encode(), list(params)).fetchone()
    assert row is not None
    return tuple(row)


def test_check_runs_against_the_exact_commit(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        job = _submit(conn, "check", repo.old)
        start_runner()
        wait_until(lambda: job_state(conn, job) in ("succeeded", "failed"), what="the check")
        verdict, code, tail = _row(
            conn, "SELECT verdict, exit_code, log_tail FROM fleetq.verdicts WHERE job_id = $1", job
        )
        assert (verdict, code) == ("passed", 0), tail
        assert f"status='' head={repo.old} token=1" in str(tail)
        assert "env clean" in str(tail)
        pid, prepare_ms, ended = _row(
            conn, "SELECT pid, prepare_ms, ended_at FROM fleetq.executions WHERE job_id = $1", job
        )
        assert pid and prepare_ms is not None and ended is not None


def test_unknown_commit_is_refused(fleet_dsn: str, start_runner: StartRunner) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        job = _submit(conn, "check", "b" * 40)
        start_runner()
        wait_until(lambda: job_state(conn, job) == "refused", what="the refusal")
        (reason,) = _row(conn, "SELECT reason FROM fleetq.verdicts WHERE job_id = $1", job)
        assert "is not in" in str(reason)


def test_control_lane_is_not_blocked_by_busy_checks(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        long_jobs = [_submit(conn, "forever", repo.head) for _ in range(2)]
        start_runner(lanes=("checks=2", "control=1"))
        wait_until(
            lambda: all(job_state(conn, j) == "claimed" for j in long_jobs),
            what="both checks slots to be busy",
        )
        ping = _submit(conn, "ping", repo.head, payload={"n": 1})
        wait_until(lambda: job_state(conn, ping) == "succeeded", what="the control job")
        assert all(job_state(conn, j) == "claimed" for j in long_jobs)


def test_capability_it_lacks_is_never_claimed(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        browser = _submit(conn, "browser", repo.head)
        pinned = _submit(conn, "check", repo.old, requested_node="node-z")
        start_runner()
        sentinel = _submit(conn, "check", repo.old)  # queued after them, same lane
        wait_until(lambda: job_state(conn, sentinel) == "succeeded", what="the sentinel")
        assert (job_state(conn, browser), job_state(conn, pinned)) == ("queued", "queued")
        (reserved,) = _row(
            conn, "SELECT reserved_memory_mb + reserved_cpu_millis FROM fleetq.runners"
        )
        assert reserved == 0


def test_a_timed_out_job_leaves_no_process_behind(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        job = _submit(conn, "hang", repo.head)
        runner = start_runner()
        wait_until(lambda: job_state(conn, job) == "failed", what="the timeout")
        (reason,) = _row(conn, "SELECT reason FROM fleetq.verdicts WHERE job_id = $1", job)
        (pid,) = _row(conn, "SELECT pid FROM fleetq.executions WHERE job_id = $1", job)
        assert reason == "timeout"
        assert not _group_alive(int(str(pid)))
        # the shell's two sleeps, orphaned to the runner (a subreaper) and killed with the
        # group, were zombies of the runner for as long as it lived: a pid each, per job
        assert _zombie_children(runner.proc.pid) == []


def _zombie_children(pid: int) -> list[int]:
    return [c.pid for c in psutil.Process(pid).children() if c.status() == psutil.STATUS_ZOMBIE]


def test_cancel_stops_the_process_and_confirms(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    from fleetq.cli.main import main

    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute("UPDATE fleetq.operations SET command = 'sleep 300' WHERE name = 'sleep'")
        job = _submit(conn, "sleep", repo.head)
        start_runner()
        wait_until(lambda: job_state(conn, job) == "running", what="the job to start")
        (pid,) = _row(conn, "SELECT pid FROM fleetq.executions WHERE job_id = $1", job)
        assert main(["--dsn", fleet_dsn, "cancel", str(job)]) == 0
        wait_until(
            lambda: _row(
                conn, "SELECT stop_confirmed FROM fleetq.executions WHERE job_id = $1", job
            )[0],
            what="the stop to be confirmed",
        )
        assert not _group_alive(int(str(pid)))
        reserved_on, state = _row(
            conn, "SELECT reserved_on, state FROM fleetq.jobs WHERE id = $1", job
        )
        assert (reserved_on, state) == (None, "cancelled")
        reason, ended, sig = _row(
            conn,
            "SELECT stop_reason, ended_at, signal FROM fleetq.executions WHERE job_id = $1",
            job,
        )
        assert (reason, sig) == ("cancelled", 15) and ended is not None


def test_drain_finishes_running_work_then_exits(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    from fleetq.cli.main import main

    with connect(fleet_dsn, autocommit=True) as conn:
        job = _submit(conn, "sleep", repo.head)
        runner = start_runner(extra=("--exit-when-drained",))
        wait_until(lambda: job_state(conn, job) == "running", what="the job to start")
        assert main(["--dsn", fleet_dsn, "drain", runner.runner_id, "--reason", "test"]) == 0
        later = _submit(conn, "check", repo.old)
        assert runner.wait(timeout=60) == 0
        assert job_state(conn, job) == "succeeded"
        assert job_state(conn, later) == "queued"
        (state,) = _row(conn, "SELECT state FROM fleetq.runners")
        assert state == "offline"  # drained, then shut down as asked


def test_sigterm_requeues_at_once_without_counting_a_loss(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        job = _submit(conn, "forever", repo.head)
        a = start_runner("node-a", extra=("--grace", "0.2"))
        wait_until(lambda: job_state(conn, job) == "claimed", what="runner a to take the job")
        a.signal(signal.SIGTERM)
        assert a.wait() == 0, a.output()
        state, lost, reassigned, version = _row(
            conn,
            "SELECT state, lost_count, reassign_count, lease_version FROM fleetq.jobs "
            "WHERE id = $1",
            job,
        )
        assert (state, lost, reassigned, version) == ("queued", 0, 0, 1)
        conn.execute(
            "UPDATE fleetq.jobs SET operation = 'ping', lane = 'control' WHERE id = $1", [job]
        )
        start_runner("node-b")
        wait_until(lambda: job_state(conn, job) == "succeeded", what="runner b to finish it")
        (owner,) = _row(
            conn,
            "SELECT runner_id FROM fleetq.events WHERE job_id = $1 AND kind = 'succeeded'",
            job,
        )
        assert owner == "node-b/r"


def test_handler_effect_commits_under_the_lease(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        job = _submit(conn, "effect", repo.head)
        start_runner()
        wait_until(lambda: job_state(conn, job) == "succeeded", what="the handler")
        assert conn.execute("SELECT job_id, token FROM effects").fetchall() == [(job, 1)]


def _group_alive(pgid: int) -> bool:
    import os

    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                return True
        except (psutil.Error, OSError):
            continue
    return False


def test_a_dropped_listen_connection_is_reestablished(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    """With polling slowed to a minute, only a working LISTEN can start a job quickly: after
    its connection is killed, the runner must listen again (and poll once on reconnect)."""
    with connect(fleet_dsn, autocommit=True) as conn:
        runner = start_runner(extra=("--poll", "60"))
        first = _submit(conn, "ping", repo.head)
        wait_until(lambda: job_state(conn, first) == "succeeded", what="a job via NOTIFY")
        (old,) = _listeners(conn)
        conn.execute("SELECT pg_terminate_backend($1)", [old[0]])
        wait_until(
            lambda: "LISTEN connection re-established" in runner.output(),
            what="the runner to listen again",
        )
        assert _listeners(conn) != [old]
        second = _submit(conn, "ping", repo.head)
        wait_until(
            lambda: job_state(conn, second) == "succeeded",
            what="a job via the new LISTEN",
            deadline_s=20,
        )


def _listeners(conn: SyncConnection) -> list[tuple[object, ...]]:
    return conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name LIKE 'fleetq-runner-listen %'"
    ).fetchall()


def test_metrics_endpoint_counts_claims_and_outcomes(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    with connect(fleet_dsn, autocommit=True) as conn:
        start_runner(extra=("--metrics-port", str(port)))
        job = _submit(conn, "ping", repo.head)
        wait_until(lambda: job_state(conn, job) == "succeeded", what="the job")
        wait_until(
            lambda: 'fleetq_outcomes_total{outcome="succeeded"} 1.0' in scrape(),
            what="the outcome to be counted",
        )
        text = scrape()
        assert 'fleetq_claims_total{lane="control"} 1.0' in text
        assert 'fleetq_slots_in_use{lane="control"} 0.0' in text


def test_a_setsid_grandchild_does_not_outlive_its_run(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE fleetq.operations SET command = $1 WHERE name = 'sleep'",
            ["sh -c 'setsid sleep 300 > /dev/null 2>&1 & exit 0'"],
        )
        job = _submit(conn, "sleep", repo.head)
        start_runner()
        wait_until(lambda: job_state(conn, job) == "succeeded", what="the job")
        (run_id,) = _row(conn, "SELECT run_id FROM fleetq.executions WHERE job_id = $1", job)
        assert _carrying(str(run_id)) == []


def test_kill_9_of_the_runner_takes_its_jobs_along(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute("UPDATE fleetq.operations SET command = 'sleep 300' WHERE name = 'sleep'")
        job = _submit(conn, "sleep", repo.head)
        runner = start_runner()
        wait_until(lambda: job_state(conn, job) == "running", what="the job to start")
        (pid,) = _row(conn, "SELECT pid FROM fleetq.executions WHERE job_id = $1", job)
        runner.signal(signal.SIGKILL)
        runner.wait()
        wait_until(
            lambda: (
                not psutil.pid_exists(int(str(pid)))
                or psutil.Process(int(str(pid))).status() == psutil.STATUS_ZOMBIE
            ),
            what="the job's process to die with its runner",
        )


def _carrying(run_id: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                if f"FLEETQ_RUN_ID={run_id}".encode() in f.read().split(b"\0"):
                    found.append(proc.pid)
        except OSError:
            continue
    return found


def test_an_effect_written_with_the_outcome_is_exactly_once(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        job = _submit(conn, "exactly_once", repo.head)
        start_runner()
        wait_until(lambda: job_state(conn, job) == "succeeded", what="the handler's outcome")
        assert conn.execute("SELECT job_id, token FROM effects").fetchall() == [(job, 1)]
        kinds = [
            k
            for (k,) in conn.execute(
                "SELECT kind FROM fleetq.events WHERE job_id = $1 ORDER BY id", [job]
            )
        ]
        assert kinds == ["submitted", "claimed", "succeeded"]


def test_the_runner_refuses_an_unmigrated_database(empty_dsn: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetq.runner",
            "--dsn",
            empty_dsn,
            "--node",
            "n",
            "--lane",
            "checks=1",
            "--work-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1
    assert "run `fleetq migrate`" in run.stderr
