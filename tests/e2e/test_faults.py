"""Faults the runner must ride out: PostgreSQL restarting under it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetq.core import migrate
from fleetq.core.db import connect
from fleetq.core.embedded import EmbeddedServer
from tests.conftest import FAST, make_home
from tests.e2e.conftest import FLEET, Repo, job_state, wait_until
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


def test_runner_survives_a_postgres_restart(
    own_server: EmbeddedServer, repo: Repo, tmp_path: Path
) -> None:
    from fleetq.core import config as fleet_config

    dsn = own_server.status().dsn
    assert dsn is not None
    migrate.migrate(dsn)
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET.format(repo=repo.path, lease=30, sleep=1))
    with connect(dsn) as conn:
        fleet_config.apply(conn, fleet_config.load(path), source=path)
    log = tmp_path / "runner.log"
    with open(log, "wb") as out:
        runner = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fleetq.runner",
                "--dsn",
                dsn,
                "--node",
                "n",
                "--lane",
                "checks=2",
                "--lane",
                "control=1",
                "--work-dir",
                str(tmp_path / "work"),
                "--poll",
                "0.2",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
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
