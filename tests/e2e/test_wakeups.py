"""A new job wakes one runner (`fleetq.announce_job`); the others look for it a moment
later, so a job announced to a runner that died unseen still runs."""

from __future__ import annotations

from fleetq.core import producer
from fleetq.core.db import SyncConnection, connect
from tests.e2e.conftest import Repo, StartRunner, wait_until


def _submit(conn: SyncConnection, operation: str, commit: str) -> int:
    return producer.submit_in_transaction(
        conn, project="repo", operation=operation, commit=commit, submitted_by="tests"
    ).job_id


def _claimed_by(conn: SyncConnection, job_id: int) -> object:
    row = conn.execute(b"SELECT lease_owner FROM fleetq.jobs WHERE id = $1", [job_id]).fetchone()
    return None if row is None else row[0]


def test_a_job_announced_to_a_dead_runner_is_taken_by_another(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    # polls 30 s apart: only the look after another runner's announcement can be quick
    live = start_runner(
        "node-b", "b", lanes=("checks=2",), extra=("--poll", "30", "--poll-max", "600")
    )
    with connect(fleet_dsn, autocommit=True) as conn:
        first = _submit(conn, "forever", repo.head)
        # announced to it and heard at once: its next poll is 30 s away
        wait_until(
            lambda: _claimed_by(conn, first) == live.runner_id,
            what="the first claim",
            deadline_s=15,
        )
        # a runner that registered and died before claiming anything: its heartbeat is
        # fresh and it has the most room, so the next job is announced to it alone
        conn.execute(
            b"SELECT fleetq.register_runner('node-g', 'ghost', '{}', 16384, 8000, "
            b"'{checks}', '{100}', 'test', 1)"
        )
        second = _submit(conn, "chatty", repo.head)
        wait_until(
            lambda: (
                _claimed_by(conn, second) == live.runner_id
                or conn.execute(
                    b"SELECT state = 'succeeded' FROM fleetq.jobs WHERE id = $1", [second]
                ).fetchone()
                == (True,)
            ),
            what="the live runner to take the job announced to the dead one",
            deadline_s=15,
        )
