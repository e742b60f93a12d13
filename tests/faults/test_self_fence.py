"""Self-fencing finishes in time (issue 12, item 7): a runner cut off from the database
stops its run, SIGKILL included, before the lease could expire and another runner,
ready to claim, starts the job again. And the database says so (item 11): the fenced
run's end is dated from the runner's clock of the exit, not from when the partition
healed, so no overlap window is reported for a run that ended before the next began."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from fleetq.core import queries
from fleetq.core.db import connect
from fleetq.runner.fencing import FenceRule
from tests.e2e.conftest import Repo, StartRunner, job_state, wait_until
from tests.e2e.test_runner import _submit
from tests.faults.proxy import fault_proxy

pytestmark = pytest.mark.slow

LEASE_S = 6


def test_a_fenced_run_is_dead_before_another_runner_can_claim_it(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: Path
) -> None:
    """It fenced at lease - max(1, lease/5) and sent SIGKILL 5 s after SIGTERM, so a job
    that ignores SIGTERM outlived its lease (2.9 s of overlap with a 10 s lease)."""
    starts = tmp_path / "starts"
    fast_reaper = tmp_path / "reaper.toml"
    fast_reaper.write_text("reap_interval_s = 0.2\n")
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute(
            b"UPDATE fleetq.settings SET value = $1 WHERE name = 'lease_seconds'", [str(LEASE_S)]
        )
        conn.execute(
            b"UPDATE fleetq.operations SET command = $1 WHERE name = 'sleep'",
            [
                'sh -c \'trap "" TERM; '
                f'echo "$FLEETQ_FENCING_TOKEN $(date +%s.%N)" >> {starts}; exec sleep 120\''
            ],
        )
        with fault_proxy(fleet_dsn) as proxy:
            cut_off = start_runner("node-a", lanes=("checks=1",), dsn=proxy.dsn)
            job = _submit(conn, "sleep", repo.head)
            wait_until(lambda: job_state(conn, job) == "running", what="the job to run on a")
            (pid,) = conn.execute(
                b"SELECT pid FROM fleetq.executions WHERE job_id = $1", [job]
            ).fetchone() or (None,)
            assert pid is not None
            start_runner("node-b", lanes=("checks=1",), extra=("--config", str(fast_reaper)))

            proxy.blackhole()
            wait_until(lambda: not _alive(int(pid)), what="the fenced run to die")
            died_at = time.time()
            wait_until(
                lambda: len(starts.read_text().splitlines()) == 2,
                what="the job to start again on b",
                deadline_s=3 * LEASE_S,
            )
            proxy.heal()
            wait_until(
                lambda: "stop confirmed job" in cut_off.output(), what="a to record its stop"
            )
        second_start = float(starts.read_text().splitlines()[1].split()[1])
        stop_reason = conn.execute(
            b"SELECT stop_reason FROM fleetq.executions WHERE job_id = $1 AND lease_version = 1",
            [job],
        ).fetchone()
        end_measured, ended_before_next = conn.execute(
            b"SELECT a.end_measured, a.ended_at < b.launched_at FROM fleetq.executions a "
            b"JOIN fleetq.executions b ON b.job_id = a.job_id AND b.lease_version = 2 "
            b"WHERE a.job_id = $1 AND a.lease_version = 1",
            [job],
        ).fetchone() or (None, None)
        reported = conn.execute(
            queries.sql("stats_overlaps").encode(), [False, job, None]
        ).fetchall()
    assert "self-fencing" in cut_off.output()
    gap = second_start - died_at
    rule = FenceRule(LEASE_S)
    print(f"fenced run gone {gap:.2f}s before the next start (margin {rule.margin_s:.1f}s)")
    assert gap > 0, f"the fenced run was still alive {-gap:.2f}s into the next execution"
    assert stop_reason is not None and stop_reason[0] in ("self_fenced", "superseded")
    # recorded at heal time, its end fell after the next launch: a phantom overlap
    assert end_measured and ended_before_next, (end_measured, ended_before_next)
    assert reported == [], f"an overlap reported for runs {gap:.2f}s apart: {reported}"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
