"""Process edges (issue 12, items 9 and 10): every path that gives a run up kills it,
and what a crashed runner left on disk is cleared at its next start."""

from __future__ import annotations

import signal

import pytest

from fleetq.cli.main import main as fleetq
from fleetq.core.db import connect
from fleetq.runner import orphans
from tests.e2e.conftest import Repo, StartRunner, job_state, wait_until
from tests.e2e.test_adoption import ADOPT, HOLD, _run_id_of
from tests.e2e.test_runner import _submit
from tests.e2e.test_supersede import _expired

pytestmark = pytest.mark.slow


def test_a_run_whose_lease_ended_while_its_runner_was_down_is_killed_at_restart(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    """With `--orphans adopt` a run outlives its runner. If the lease ended meanwhile,
    the restarted runner closed the journal entry without killing the run, which then
    ran next to the job's newer execution, invisible to `fleetq overlaps`."""
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute(b"UPDATE fleetq.settings SET value = '3' WHERE name = 'lease_seconds'")
        conn.execute(b"UPDATE fleetq.operations SET command = 'sleep 120' WHERE name = 'sleep'")
        job = _submit(conn, "sleep", repo.head)
        runner = start_runner(extra=ADOPT, env=HOLD)  # its start report never arrives
        work = runner.log.parent  # the test's directory, where the runner stages the job
        wait_until(lambda: _run_id_of(job, work) is not None, what="the command to be launched")
        run_id = _run_id_of(job, work)
        assert run_id is not None
        runner.signal(signal.SIGKILL)
        runner.wait()
        assert orphans.carrying(run_id), "in adopt mode the run outlives its runner"
        wait_until(lambda: _expired(conn, job), what="the lease to expire")
        assert fleetq(["--dsn", fleet_dsn, "reap"]) == 0
        assert job_state(conn, job) == "queued"
        trees = runner.log.parent / "work" / "node-a__r" / "trees"
        (trees / "left-by-a-crash").mkdir(parents=True, exist_ok=True)

        restarted = start_runner(extra=ADOPT, lanes=("control=1",))  # it will not re-claim
        wait_until(lambda: not orphans.carrying(run_id), what="the orphaned run to be killed")
        wait_until(lambda: not any(trees.iterdir()), what="the staged trees of the crash to go")
        assert f"killed run {run_id}" in restarted.output()
