"""A restarted runner settles what the database says it holds (the collection pass)."""

from __future__ import annotations

import signal

import pytest

from fleetq.core.db import SyncConnection, connect
from tests.e2e.conftest import Repo, RunnerProcess, StartRunner, job_state, wait_until
from tests.e2e.test_runner import _row, _submit

pytestmark = pytest.mark.slow


def _kill_9(runner: RunnerProcess) -> None:
    runner.signal(signal.SIGKILL)
    runner.wait()


def _counters(conn: SyncConnection, job: int) -> tuple[object, ...]:
    return _row(
        conn,
        "SELECT state, lost_count, reassign_count, lease_version, failure_reason "
        "FROM fleetq.jobs WHERE id = $1",
        job,
    )


def _claim_it_never_heard_of(conn: SyncConnection, runner: RunnerProcess, repo: Repo) -> int:
    """A control job the database says `runner` claimed a minute ago (its reply lost for
    good), holding the lane's one slot, while the runner runs nothing for it."""
    conn.execute("UPDATE fleetq.runners SET state = 'paused'")  # so it cannot claim it
    job = _submit(conn, "ping", repo.head)
    conn.execute(
        "UPDATE fleetq.jobs SET state = 'claimed', lease_owner = $1, reserved_on = $1, "
        "lease_version = 1, claim_id = gen_random_uuid(), "
        "claimed_at = clock_timestamp() - interval '1 minute', "
        "lease_expires_at = clock_timestamp() + interval '1 hour' WHERE id = $2",
        [runner.runner_id, job],
    )
    conn.execute("UPDATE fleetq.runner_lanes SET slots_used = 1 WHERE lane = 'control'")
    conn.execute("UPDATE fleetq.runners SET state = 'active'")
    return job


def test_killed_twice_while_holding_a_job_fails_it_as_lost(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        job = _submit(conn, "forever", repo.head)
        runner = start_runner()
        wait_until(lambda: job_state(conn, job) == "claimed", what="the runner to hold it")
        _kill_9(runner)
        # restarted (same node/name, so the same runner): the claim is reported lost,
        # requeued, and claimed again under the next token
        runner = start_runner()
        wait_until(lambda: _counters(conn, job)[:2] == ("claimed", 1), what="the first loss")
        assert "collection pass: 1 reported lost" in runner.output()
        _kill_9(runner)
        start_runner()
        wait_until(lambda: _counters(conn, job)[1] == 2, what="the second loss")
        assert _counters(conn, job) == ("failed", 2, 0, 2, "lost")
        (verdict, reason) = _row(
            conn, "SELECT verdict, reason FROM fleetq.verdicts WHERE job_id = $1", job
        )
        # the job failed; its check never ran to an end: the verdict says error (issue 42)
        assert (verdict, reason) == ("error", "lost")


def test_a_launched_command_that_died_with_its_runner_runs_again(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: object
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute("UPDATE fleetq.operations SET command = 'sleep 2' WHERE name = 'sleep'")
        job = _submit(conn, "sleep", repo.head)
        runner = start_runner()
        wait_until(lambda: job_state(conn, job) == "running", what="the command to start")
        _kill_9(runner)
        start_runner()
        wait_until(lambda: job_state(conn, job) == "succeeded", what="the second run")
        assert _counters(conn, job) == ("succeeded", 1, 0, 2, None)
        stops = conn.execute(
            "SELECT lease_version, stop_reason, ended_at IS NOT NULL FROM "
            "fleetq.executions WHERE job_id = $1 ORDER BY 1",
            [job],
        ).fetchall()
        assert stops == [(1, "lost", True), (2, None, True)]
        (delay,) = _row(
            conn,
            "SELECT extract(epoch FROM c.at - l.at) FROM fleetq.events l "
            "JOIN fleetq.events c ON c.job_id = l.job_id AND c.kind = 'claimed' "
            "AND c.lease_version = 2 WHERE l.job_id = $1 AND l.kind = 'lost'",
            job,
        )
        print(
            f"kill -9 of a running command: reported lost and claimed again {delay:.3f}s "
            "after the restarted runner's report"
        )


def test_a_cancel_that_arrived_while_the_runner_was_down_is_confirmed(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    from fleetq.cli.main import main

    with connect(fleet_dsn, autocommit=True) as conn:
        job = _submit(conn, "forever", repo.head)
        runner = start_runner()
        wait_until(lambda: job_state(conn, job) == "claimed", what="the runner to hold it")
        _kill_9(runner)
        assert main(["--dsn", fleet_dsn, "cancel", str(job)]) == 0
        assert _row(conn, "SELECT reserved_on FROM fleetq.jobs WHERE id = $1", job) != (None,)
        start_runner()
        wait_until(
            lambda: _row(conn, "SELECT reserved_on FROM fleetq.jobs WHERE id = $1", job) == (None,),
            what="the stop to be confirmed",
        )
        (reserved,) = _row(
            conn, "SELECT reserved_memory_mb + reserved_cpu_millis FROM fleetq.runners"
        )
        assert reserved == 0


def test_a_claim_the_runner_never_heard_of_is_settled_before_expiry(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    """A claim whose reply was lost for good: the database says the runner holds the job,
    the runner runs nothing. The periodic collection pass reports it lost (long before its
    one-hour lease would expire) and the job runs."""
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute("UPDATE fleetq.settings SET value = '2' WHERE name = 'lease_seconds'")
        runner = start_runner()
        job = _claim_it_never_heard_of(conn, runner, repo)
        wait_until(lambda: job_state(conn, job) == "succeeded", what="the stray to be settled")
        assert _counters(conn, job) == ("succeeded", 1, 0, 2, None)
        assert f"stray job={job}" in runner.output()


def test_a_cancelled_claim_the_runner_never_heard_of_gives_its_room_back_at_once(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    """The strays pass confirms the stop of a cancelled job the runner holds but never ran
    (closing the execution its cancel recorded), which frees that lane's slot; the lane
    then claims what waits at once. The runner polls
    only every 600 s here, so only a wake-up from the pass can take the next job in time
    (red when the pass gives the room back silently)."""
    from fleetq.cli.main import main

    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute("UPDATE fleetq.settings SET value = '2' WHERE name = 'lease_seconds'")
        runner = start_runner(extra=("--poll", "600", "--poll-max", "600"))
        stray = _claim_it_never_heard_of(conn, runner, repo)
        assert main(["--dsn", fleet_dsn, "cancel", str(stray)]) == 0
        waiting = _submit(conn, "ping", repo.head)  # the lane's one slot is the stray's
        wait_until(
            lambda: (
                _row(conn, "SELECT reserved_on FROM fleetq.jobs WHERE id = $1", stray) == (None,)
            ),
            what="the strays pass to confirm the cancelled job's stop",
        )
        wait_until(
            lambda: job_state(conn, waiting) == "succeeded",
            what="the freed slot to take the waiting job (a wake-up, not a poll)",
            deadline_s=15,
        )
        stop = _row(conn, "SELECT stop_reason FROM fleetq.executions WHERE job_id = $1", stray)
        assert stop == ("cancelled",)  # what ended its lease, not just "moved on"
