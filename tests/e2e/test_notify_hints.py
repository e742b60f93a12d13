"""Notifications are hints (issue 41, finding 13): PostgreSQL has no privilege for NOTIFY
on a channel, so any login (a reader's too) can send `fleetq_work` and `fleetq_control`.
Nothing such a notification carries may make a runner act without re-reading the
database: a forged `job:N` stops nothing while the database says the lease is held, a
forged `runner:ID` re-reads the runner's state, and a flood of wake-ups costs polls."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from fleetq.core import roles
from fleetq.core.db import SyncConnection, connect
from tests.e2e.conftest import Repo, StartRunner, job_state, wait_until
from tests.e2e.test_runner import _row, _submit

pytestmark = pytest.mark.slow

FLOOD = 300  # of each forged payload


@pytest.fixture
def reader_dsn(fleet_dsn: str, tmp_path: Path) -> Iterator[str]:
    """A reader's login: it may read the queue and nothing else, NOTIFY aside."""
    name = f"fq_reader_{uuid.uuid4().hex[:10]}"
    with connect(fleet_dsn) as conn:
        created = roles.add(
            conn,
            roles.Kind.READER,
            "watcher",
            admin_dsn=fleet_dsn,
            password_file=tmp_path / "reader.pgpass",
            login=name,
        )
        conn.commit()
    yield created.dsn
    with connect(fleet_dsn, autocommit=True) as conn:
        wait_until(
            lambda: (
                _row(conn, "SELECT count(*) FROM pg_stat_activity WHERE usename = $1", name) == (0,)
            ),
            what="the reader's sessions to end",
        )
        roles.remove(conn, name)


def test_forged_notifications_from_a_reader_move_nothing(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, reader_dsn: str, tmp_path: Path
) -> None:
    done = tmp_path / "done"
    # one slot: the held job fills the lane, so a wake-up naming this runner makes it
    # announce the lane (fleetq_work 'checks' from its own session), the marker below
    runner = start_runner(
        "node-a", "r", lanes=("checks=1", "control=1"), extra=("--memory-mb", "1000")
    )
    with connect(fleet_dsn, autocommit=True) as conn:
        job = _submit(conn, "until", repo.head, payload={"path": str(done)})
        wait_until(
            lambda: (
                _row(conn, "SELECT state, lease_version FROM fleetq.jobs WHERE id = $1", job)
                == ("claimed", 1)  # a handler's job reports no start
            ),
            what="the runner to run the job under token 1",
        )
        with psycopg.connect(reader_dsn, autocommit=True) as forger:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                forger.execute("UPDATE fleetq.jobs SET state = 'cancelled'")
            forger_pid = forger.info.backend_pid
            with psycopg.connect(fleet_dsn, autocommit=True) as ear:
                ear.execute("LISTEN fleetq_work")
                _forge(forger, job, runner.runner_id)
                # Notifications reach a listener in the order they were sent, the control
                # ones first: once the runner answers a wake-up, it has handled every
                # `job:N` and `runner:ID` (one that stopped on `job:N` alone has stopped).
                _wait_for_announce(ear, forger_pid)
        _assert_untouched(conn, job, runner.runner_id)
        done.touch()
        wait_until(lambda: job_state(conn, job) == "succeeded", what="the job to succeed")
        _assert_untouched(conn, job, runner.runner_id)
        assert runner.proc.poll() is None, runner.output()
        assert "stopping job" not in runner.output(), runner.output()


def _forge(forger: psycopg.Connection[tuple[object, ...]], job: int, runner_id: str) -> None:
    payloads = [f"job:{job}", f"runner:{runner_id}"] * FLOOD
    payloads += [f"checks {runner_id}", f"control {runner_id}", "checks", "control"] * FLOOD
    payloads += [f"checks other/{runner_id}", "job:x", "runner:", "nonsense"]
    with forger.transaction():  # delivered at commit, all at once, in this order
        for channel in ("fleetq_control", "fleetq_work"):
            for payload in payloads:
                if payload.startswith(("job:", "runner:")) == (channel == "fleetq_control"):
                    forger.execute("SELECT pg_notify(%s, %s)", [channel, payload])
        forger.execute("SELECT pg_notify('fleetq_work', %s)", [f"checks {runner_id}"])


def _wait_for_announce(ear: psycopg.Connection[tuple[object, ...]], forger_pid: int) -> None:
    """Until the runner's own session announces the lane (a NOTIFY not from the forger)."""
    for note in ear.notifies(timeout=30):
        if note.pid != forger_pid and note.payload == "checks":
            return
    pytest.fail("the runner never answered the forged wake-ups")


def _assert_untouched(conn: SyncConnection, job: int, runner_id: str) -> None:
    """Token 1 still holds the job, no execution of it was stopped, the runner is active."""
    assert _row(conn, "SELECT lease_version FROM fleetq.jobs WHERE id = $1", job) == (1,)
    stops = _row(
        conn,
        "SELECT count(*) FROM fleetq.executions WHERE job_id = $1 AND stop_reason IS NOT NULL",
        job,
    )
    assert stops == (0,)
    assert _row(conn, "SELECT state FROM fleetq.runners WHERE id = $1", runner_id) == ("active",)
