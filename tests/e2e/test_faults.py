"""Faults the runner must ride out: PostgreSQL restarting under it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from fleetq.core import migrate
from fleetq.core.db import connect
from fleetq.core.embedded import EmbeddedServer
from fleetq.runner import executor
from tests.conftest import FAST, make_home
from tests.e2e.conftest import FLEET, ROOT, Repo, job_state, wait_until
from tests.e2e.test_runner import _submit

pytestmark = pytest.mark.slow


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    """A server of this test's own, so restarting it disturbs no other test."""
    home = make_home()
    server = EmbeddedServer(home, settings=FAST)
    server.ensure_running()
    yield server
    server.stop()
    shutil.rmtree(home, ignore_errors=True)


def _fleet(server: EmbeddedServer, repo: Repo, tmp_path: Path, *, lease: int) -> str:
    """Migrate the server's database and apply the test fleet; returns its DSN."""
    from fleetq.core import config as fleet_config

    dsn = server.status().dsn
    assert dsn is not None
    migrate.migrate(dsn)
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET.format(repo=repo.path, lease=lease, sleep=1))
    with connect(dsn) as conn:
        fleet_config.apply(conn, fleet_config.load(path), source=path)
    return dsn


def _runner(
    dsn: str,
    tmp_path: Path,
    *lanes: str,
    node: str = "n",
    name: str = "runner",
    extra: Sequence[str] = (),
) -> tuple[subprocess.Popen[bytes], Path]:
    """A runner process `NODE/NAME` logging to a file (returned with it); unlike the
    `start_runner` fixture, nothing waits for it to serve."""
    log = tmp_path / f"{node}-{name}.log"
    argv = [
        sys.executable,
        "-m",
        "fleetq.runner",
        "--dsn",
        dsn,
        "--node",
        node,
        "--name",
        name,
        "--work-dir",
        str(tmp_path / "work"),
        "--poll",
        "0.2",
        *[a for lane in lanes for a in ("--lane", lane)],
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT), log


def test_runner_survives_a_postgres_restart(
    own_server: EmbeddedServer, repo: Repo, tmp_path: Path
) -> None:
    dsn = _fleet(own_server, repo, tmp_path, lease=30)
    runner, log = _runner(dsn, tmp_path, "checks=2", "control=1")
    try:
        with connect(dsn, autocommit=True) as conn:
            first = _submit(conn, "ping", repo.head)
            wait_until(lambda: job_state(conn, first) == "succeeded", what="a job before")
        own_server.stop()  # fast shutdown: every connection of the runner is cut
        own_server.ensure_running()
        with connect(dsn, autocommit=True) as conn:
            second = _submit(conn, "ping", repo.head)
            wait_until(
                lambda: job_state(conn, second) == "succeeded", what="a job after", deadline_s=60
            )
        assert runner.poll() is None, log.read_text()
    finally:
        runner.terminate()
        runner.wait(timeout=30)


def test_a_runner_cut_from_the_database_fences_itself(
    own_server: EmbeddedServer, repo: Repo, tmp_path: Path
) -> None:
    """The database goes away under a running job: the runner stops the job itself,
    records that once the database is back, and the job then completes exactly once (its
    second run finds the marker the first one left). With the whole database gone no
    other runner can claim, so this test cannot see a fence that finishes late: that
    one, with one runner partitioned and another ready to claim, is
    tests/faults/test_self_fence.py."""
    dsn = _fleet(own_server, repo, tmp_path, lease=4)
    marker = tmp_path / "first-run-was-here"
    with connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE fleetq.operations SET command = $1 WHERE name = 'sleep'",
            [f"sh -c 'test -e {marker} && exit 0; touch {marker}; sleep 60'"],
        )
        job = _submit(conn, "sleep", repo.head)
    runner, log = _runner(dsn, tmp_path, "checks=1")
    try:
        wait_until(marker.exists, what="the first run to start")
        with connect(dsn, autocommit=True) as conn:
            # the process starts before its start report commits: wait for the report
            def reported_pid() -> int | None:
                row = conn.execute(
                    "SELECT pid FROM fleetq.executions WHERE job_id = $1", [job]
                ).fetchone()
                return None if row is None else int(row[0]) if row[0] is not None else None

            wait_until(reported_pid, what="the first run's start report")
            pid = reported_pid()
        assert pid
        cut = time.monotonic()
        own_server.stop()
        wait_until(lambda: "self-fencing" in log.read_text(), what="the runner to fence itself")
        fenced = time.monotonic() - cut
        wait_until(lambda: not executor.group_members(int(pid)), what="the job's processes to go")
        own_server.ensure_running()
        with connect(dsn, autocommit=True) as conn:
            wait_until(
                lambda: job_state(conn, job) == "succeeded",
                what="the job to complete",
                deadline_s=60,
            )
            stops = conn.execute(
                "SELECT lease_version, stop_reason FROM fleetq.executions "
                "WHERE job_id = $1 ORDER BY lease_version",
                [job],
            ).fetchall()
            outcomes = conn.execute(
                "SELECT count(*) FROM fleetq.events WHERE job_id = $1 AND "
                "kind IN ('succeeded', 'failed')",
                [job],
            ).fetchone()
        # self_fenced, unless the lease expired and the job was claimed again before the
        # runner could record it: then the record says what really happened, superseded
        assert stops[0] in ((1, "self_fenced"), (1, "superseded"))
        assert outcomes == (1,)
        print(f"self-fenced {fenced:.2f}s after the database went away (lease 4s)")
    finally:
        runner.terminate()
        runner.wait(timeout=30)
