"""`--orphans adopt`: a run whose start report was lost outlives its runner's kill -9 and
is adopted by the restarted runner; anything ambiguous is refused."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from fleetq.core.db import SyncConnection, connect
from fleetq.runner import orphans
from fleetq.runner.journal import Journal
from tests.e2e.conftest import Repo, RunnerProcess, StartRunner, job_state, wait_until
from tests.e2e.test_runner import _row, _submit

pytestmark = pytest.mark.slow
ADOPT = ("--orphans", "adopt")
HOLD = {"FLEETQ_TEST_HOLD_START_REPORT": "1"}


def _run_id_of(job: int, under: Path) -> str | None:
    """The FLEETQ_RUN_ID of the live process group leader running `job`, if any, among
    processes working under `under` (the test's own directory: tests run side by side,
    each numbering its jobs from 1)."""
    for proc in psutil.process_iter(["pid", "cwd"]):
        try:
            if not (proc.info["cwd"] or "").startswith(f"{under}{os.sep}"):
                continue
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            if env.get(b"FLEETQ_JOB_ID") == str(job).encode() and os.getpgid(proc.pid) == proc.pid:
                return env[b"FLEETQ_RUN_ID"].decode()
        except (OSError, ValueError, psutil.Error):
            continue
    return None


def _launched_without_a_start_report(
    conn: SyncConnection, repo: Repo, start_runner: StartRunner, release: Path
) -> tuple[int, str, RunnerProcess]:
    # The run lasts until the test releases it (at most 2 minutes), not a fixed time: a
    # restarted runner on a loaded machine took longer than the 3 s the run used to last,
    # and found nothing left to adopt.
    conn.execute(
        "UPDATE fleetq.operations SET command = $1 WHERE name = 'sleep'",
        [
            shlex.join(
                [
                    "sh",
                    "-c",
                    f"i=0; until [ -e '{release}' ] || [ $i -ge 1200 ]; do sleep 0.1; "
                    "i=$((i+1)); done",
                ]
            )
        ],
    )
    job = _submit(conn, "sleep", repo.head)
    runner = start_runner(extra=ADOPT, env=HOLD)
    wait_until(lambda: _run_id_of(job, release.parent) is not None, what="the command to launch")
    run_id = _run_id_of(job, release.parent)
    assert run_id is not None
    # the pid is journaled just after the process starts: killed before that, the
    # restarted runner cannot tell the run's process and rightly refuses to adopt it
    wait_until(lambda: _journaled_pid(job, release.parent), what="the launch's pid journaled")
    assert job_state(conn, job) == "claimed"  # the start report was held back
    runner.signal(signal.SIGKILL)
    runner.wait()
    assert orphans.carrying(run_id), "in adopt mode the run outlives its runner"
    return job, run_id, runner


def _journaled_pid(job: int, under: Path) -> bool:
    return any(
        entry.pid is not None
        for path in under.glob("work/**/journal.jsonl")
        for (job_id, _), entry in Journal(path).open_entries().items()
        if job_id == job
    )


@pytest.fixture
def decoys() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_run_whose_start_report_was_lost_is_adopted(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    with connect(fleet_dsn, autocommit=True) as conn:
        job, run_id, _ = _launched_without_a_start_report(conn, repo, start_runner, release)
        restarted = start_runner(extra=ADOPT)
        wait_until(lambda: f"adopted job={job}" in restarted.output(), what="the adoption")
        release.touch()  # the adopted run may end now
        wait_until(lambda: job_state(conn, job) == "succeeded", what="the adopted run's outcome")
        started = conn.execute(
            "SELECT detail->>'run_id' FROM fleetq.events WHERE job_id = $1 AND kind = 'started'",
            [job],
        ).fetchall()
        assert started == [(run_id,)]  # reported once, with the original run id
        assert _row(
            conn, "SELECT lost_count, lease_version FROM fleetq.jobs WHERE id = $1", job
        ) == (0, 1)
        (verdict, code) = _row(
            conn, "SELECT verdict, exit_code FROM fleetq.verdicts WHERE job_id = $1", job
        )
        assert (verdict, code) == ("passed", 0)


def test_an_ambiguous_run_is_refused_with_evidence(
    fleet_dsn: str,
    repo: Repo,
    start_runner: StartRunner,
    decoys: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    release = tmp_path / "release"
    try:
        _refused_with_evidence(fleet_dsn, repo, start_runner, decoys, release)
    finally:
        release.touch()  # the held run ends


def _refused_with_evidence(
    fleet_dsn: str,
    repo: Repo,
    start_runner: StartRunner,
    decoys: list[subprocess.Popen[bytes]],
    release: Path,
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        job, run_id, _ = _launched_without_a_start_report(conn, repo, start_runner, release)
        # a second process group claiming the same run id: which one is the job?
        decoys.append(
            subprocess.Popen(
                ["sleep", "30"], start_new_session=True, env={**os.environ, "FLEETQ_RUN_ID": run_id}
            )
        )
        restarted = start_runner(extra=ADOPT)
        wait_until(lambda: "adoption refused" in restarted.output(), what="the refusal")
        (detail,) = _row(
            conn,
            "SELECT detail FROM fleetq.events WHERE job_id = $1 AND kind = 'adoption_refused'",
            job,
        )
        evidence = detail if isinstance(detail, dict) else json.loads(str(detail))
        assert evidence["run_id"] == run_id and len(evidence["carriers"]) >= 2
        assert job_state(conn, job) == "claimed"  # left to lease expiry, not guessed
