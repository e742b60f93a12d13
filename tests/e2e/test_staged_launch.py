"""A staged launch asks the database, not only its own stop flag (issue 43)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from fleetq.cli.main import main as fleetq
from fleetq.core.db import SyncConnection, connect
from tests.e2e.conftest import Repo, StartRunner, job_state, wait_until
from tests.e2e.test_runner import _row, _submit

pytestmark = pytest.mark.slow

_LISTEN_WAITS = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND application_name LIKE 'fleetq-runner-listen %' AND wait_event_type = 'Lock'"
)


def _git_held_by(hold: Path, shim: Path) -> None:
    """A `git` on PATH that, while `hold` exists, says it got there and waits."""
    real_git = shutil.which("git")
    assert real_git
    shim.mkdir()
    (shim / "git").write_text(
        f'#!/bin/sh\nif [ -e "{hold}" ]; then touch "{hold}.reached"\n'
        f'  while [ -e "{hold}" ]; do sleep 0.05; done\nfi\nexec "{real_git}" "$@"\n'
    )
    (shim / "git").chmod(0o755)


def _deafen(conn: SyncConnection, lock: SyncConnection, runner_id: str) -> None:
    """Keep the runner from hearing notifications: its LISTEN session is ended, and its
    new one waits (before it listens) for the runner id's row, which `lock` holds."""
    lock.execute(
        "SELECT 1 FROM fleetq.coordination WHERE name = 'runner:' || $1 FOR UPDATE", [runner_id]
    )
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
        "current_database() AND application_name LIKE 'fleetq-runner-listen %'"
    )
    wait_until(
        lambda: _row(conn, _LISTEN_WAITS) == (1,),
        what="the runner's new LISTEN session to wait for its id, not yet listening",
    )


def test_a_cancel_not_yet_heard_keeps_a_staged_job_from_starting(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: Path
) -> None:
    """The check before launch read only the execution's stop flag: a cancel committed
    while the runner could not hear it (its LISTEN session gone, the renewal not yet
    due) let the job start, and it stopped again only when its start report answered
    `stale`. The launch now asks the database first; the job's command, which leaves a
    marker, never runs."""
    hold, marker = tmp_path / "hold-git", tmp_path / "ran"
    _git_held_by(hold, tmp_path / "bin")
    with connect(fleet_dsn, autocommit=True) as conn, connect(fleet_dsn) as lock:
        conn.execute(
            "UPDATE fleetq.operations SET command = $1 WHERE name = 'sleep'", [f"touch {marker}"]
        )
        runner = start_runner(env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
        hold.touch()
        job = _submit(conn, "sleep", repo.head)
        wait_until(Path(f"{hold}.reached").exists, what="staging to begin")
        _deafen(conn, lock, runner.runner_id)
        assert fleetq(["--dsn", fleet_dsn, "cancel", str(job)]) == 0
        hold.unlink()  # staging ends; the runner has not heard of the cancel
        wait_until(
            lambda: (
                _row(conn, "SELECT reserved_on IS NULL FROM fleetq.jobs WHERE id = $1", job)
                == (True,)
            ),
            what="the stop to be confirmed",
            show=runner.output,
        )
        lock.rollback()
        assert job_state(conn, job) == "cancelled"
        assert not marker.exists(), runner.output()
        assert f"not launching job={job} token=1: cancelled" in runner.output()
        assert "stop requested while staging" not in runner.output()  # not heard before
        # no start was ever recorded: nothing ran to be stopped
        assert _row(conn, "SELECT count(*) FROM fleetq.executions WHERE job_id = $1", job) == (0,)
    assert runner.proc.poll() is None
