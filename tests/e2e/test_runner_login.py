"""A runner on a login of its own (issue 13): everything a runner does goes through the
functions its group may execute, so a grant forgotten anywhere shows up here: start-up
checks, registration, the runner-id lock, claims, start reports, the handler's locked
transaction, outcomes, cancel and stop confirmation, its lane's schedules, shutdown."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

from fleetq.core import roles
from fleetq.core.db import connect
from tests.e2e.conftest import Repo, StartRunner, _git, job_state, wait_until
from tests.e2e.test_faults import _runner
from tests.e2e.test_runner import _submit

pytestmark = pytest.mark.slow


def _runner_login(fleet_dsn: str, tmp_path: Path) -> tuple[str, roles.Created]:
    """A login for runner node-a/r (a unique role name: roles are the cluster's)."""
    name = f"fq_runner_{uuid.uuid4().hex[:10]}"
    with connect(fleet_dsn) as conn:
        created = roles.add(
            conn,
            roles.Kind.RUNNER,
            "node-a/r",
            admin_dsn=fleet_dsn,
            password_file=tmp_path / "runner.pgpass",
            login=name,
        )
        conn.commit()
    return name, created


def test_a_runner_on_its_own_login_runs_every_kind_of_job(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: Path
) -> None:
    name, created = _runner_login(fleet_dsn, tmp_path)
    with connect(fleet_dsn) as conn:
        conn.execute(f'GRANT INSERT ON effects TO "{name}"'.encode())  # the handler's table
        conn.commit()
    try:
        runner = start_runner("node-a", "r", dsn=created.dsn)
        with connect(fleet_dsn, autocommit=True) as conn:
            sleeper = _submit(conn, "sleep", repo.head)
            wait_until(lambda: job_state(conn, sleeper) == "running", what="the sleeper to run")
            conn.execute(b"SELECT * FROM fleetq.cancel($1, 'ops', 'test')", [sleeper])
            wait_until(
                lambda: f"stop confirmed job={sleeper}" in runner.output(),
                what="the runner to confirm the stop",
            )
            done = _submit(conn, "sleep", repo.head)
            effect = _submit(conn, "exactly_once", repo.head)
            wait_until(lambda: job_state(conn, done) == "succeeded", what="the command job")
            wait_until(lambda: job_state(conn, effect) == "succeeded", what="the handler job")
            effects = conn.execute(b"SELECT job_id FROM effects").fetchall()
            assert [tuple(e) for e in effects] == [(effect,)]
        runner.signal(signal.SIGTERM)
        assert runner.wait() == 0, runner.output()
        assert "permission denied" not in runner.output().lower(), runner.output()
    finally:
        with connect(fleet_dsn) as conn:
            conn.execute(f'REVOKE ALL ON effects FROM "{name}"'.encode())
            roles.remove(conn, name)
            conn.commit()


def test_a_runner_login_started_as_another_runner_says_so(fleet_dsn: str, tmp_path: Path) -> None:
    """Misconfigured: the login is node-a's, the runner says it is node-b. It exits with
    the reason, instead of retrying for ever or acting as node-b."""
    name, created = _runner_login(fleet_dsn, tmp_path)
    try:
        proc, log = _runner(created.dsn, tmp_path, "checks=1", node="node-b", name="r")
        assert proc.wait(timeout=30) == 1
        assert "acts as runner node-a/r only, not as node-b/r" in log.read_text()
    finally:
        with connect(fleet_dsn) as conn:
            roles.remove(conn, name)
            conn.commit()


def test_a_runner_on_its_own_login_fires_its_lane_s_schedules(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: Path
) -> None:
    """Every runner fires the due ticks of its lanes' schedules (not the reaper's leader),
    resolving a branch's head, on its first look after start."""
    branch = _git(repo.path, "symbolic-ref", "--short", "HEAD")
    name, created = _runner_login(fleet_dsn, tmp_path)
    try:
        with connect(fleet_dsn, autocommit=True) as conn:
            conn.execute(
                b"INSERT INTO fleetq.schedules (name, cron, project, operation, branch, "
                b"last_tick) VALUES ('nightly', '* * * * *', 'repo', 'chatty', $1, "
                b"clock_timestamp() - interval '1 hour')",
                [branch],
            )
            runner = start_runner("node-a", "r", lanes=("checks=1",), dsn=created.dsn)

            def fired() -> list[tuple[object, ...]]:
                found = (
                    b"SELECT commit_sha FROM fleetq.jobs WHERE submitted_by = 'schedule:nightly'"
                )
                return [tuple(r) for r in conn.execute(found).fetchall()]

            wait_until(fired, what="the schedule's tick to fire")
            assert fired() == [(repo.head,)]
            wait_until(lambda: "schedule nightly fired job" in runner.output(), what="its log")
        runner.signal(signal.SIGTERM)
        assert runner.wait() == 0, runner.output()
        assert "permission denied" not in runner.output().lower(), runner.output()
    finally:
        with connect(fleet_dsn) as conn:
            roles.remove(conn, name)
            conn.commit()
