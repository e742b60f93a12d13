"""Settings reach running runners (issue 42): a lease setting changed by `fleetq apply`
while runners run fences no healthy run. Runners started under one lease renewed at
its cadence after `apply` set a shorter one, so every lease expired, runs were
superseded again and again, and a passing commit ended `failed`. Now each runner reads
the settings again at the apply's notice, and renews each lease by the length the
database granted it (the claim and each renewal answer it)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from fleetq.core import config
from fleetq.core.db import SyncConnection, connect
from tests.e2e.conftest import FLEET, Repo, RunnerProcess, StartRunner, job_state, wait_until
from tests.e2e.test_runner import _submit

pytestmark = pytest.mark.slow

RUN_S = 20  # each job's run: several renewals of the short lease, two of the long one
# what a run fenced by the database (expiry, a newer token) or by itself leaves
FENCED = ("lease_expired", "stopped", "stale_rejected", "stale_self_race", "released", "lost")


def _apply(dsn: str, repo: Repo, path: Path, lease: int) -> None:
    path.write_text(FLEET.format(repo=repo.path, lease=lease, sleep=RUN_S))
    with connect(dsn) as conn:
        config.apply(conn, config.load(path), source=path)
        conn.commit()


def _ended(conn: SyncConnection, job: int) -> tuple[str, int, int] | None:
    row = conn.execute(
        "SELECT state, lease_version, (SELECT count(*) FROM fleetq.executions e "
        "WHERE e.job_id = j.id) FROM fleetq.jobs j WHERE id = $1",
        [job],
    ).fetchone()
    assert row is not None
    return None if row[0] in ("queued", "claimed", "running") else (row[0], row[1], row[2])


def _heard(runners: list[RunnerProcess], lease: int) -> bool:
    return all(f"settings: lease {lease}s" in r.output() for r in runners)


@pytest.mark.parametrize(("before", "after"), [(30, 5), (5, 30)], ids=["30-to-5", "5-to-30"])
def test_a_lease_changed_by_apply_fences_no_healthy_run(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: Path, before: int, after: int
) -> None:
    fleet = tmp_path / "settings.toml"
    _apply(fleet_dsn, repo, fleet, before)
    runners = [start_runner("node-a", lanes=("checks=1",)), start_runner("node-b")]
    with connect(fleet_dsn, autocommit=True) as conn:
        # one job claimed and started under the old lease, one claimed under the new
        running = _submit(conn, "sleep", repo.head)
        wait_until(
            lambda: job_state(conn, running) == "running",
            what="the first job to run under the old lease",
        )
        _apply(fleet_dsn, repo, fleet, after)
        claimed = _submit(conn, "sleep", repo.head)
        for job in (running, claimed):
            wait_until(
                functools.partial(_ended, conn, job),
                what=f"job {job} to end",
                deadline_s=RUN_S + 30,
            )
            # it ran once, under the token of its first claim, and passed
            assert _ended(conn, job) == ("succeeded", 1, 1), [r.output() for r in runners]
            fenced = conn.execute(
                "SELECT kind, lease_version, runner_id FROM fleetq.events "
                "WHERE job_id = $1 AND kind = ANY($2)",
                [job, list(FENCED)],
            ).fetchall()
            assert fenced == []
        # every runner read the new setting at the apply's notice (its beat follows it)
        wait_until(lambda: _heard(runners, after), what="every runner to read the new lease")
    for runner in runners:
        assert "self-fencing" not in runner.output(), runner.output()
