"""Jobs cannot read the runner's secrets (issue 13): a job ran as the runner's uid and
read `FLEETQ_DSN=postgresql://…:<password>@…` from `/proc/$PPID/environ`; a root runner
ran jobs as root. With `--job-user` command jobs run as that user. (Run as root, as CI
is: only root can start processes as another user.)"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetq.core.db import connect
from tests.e2e.conftest import Repo, StartRunner, job_state, wait_until
from tests.e2e.test_faults import _runner
from tests.e2e.test_runner import _submit

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="only root can run jobs as another user"),
]


@pytest.fixture
def open_work_dir() -> Iterator[Path]:
    """A work directory other users may pass through (tmp_path's parents are 0700)."""
    top = Path(tempfile.mkdtemp(prefix="fleetq-work-"))
    top.chmod(0o711)
    yield top / "work"
    subprocess.run(["rm", "-rf", str(top)], check=False)


def test_a_job_under_job_user_cannot_read_the_runner_s_environment(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, open_work_dir: Path
) -> None:
    # the runner's password file, as `fleetq roles add-runner` writes it (0600)
    passfile = open_work_dir.parent / "runner.pgpass"
    passfile.write_text("*:*:*:runner:secret\n")
    passfile.chmod(0o600)
    peek = (
        "sh -c 'id -un; "
        "cat /proc/$PPID/environ > /dev/null 2>&1 && echo LEAKED || echo DENIED; "
        f"cat {passfile} > /dev/null 2>&1 && echo LEAKED || echo DENIED'"
    )
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute(b"UPDATE fleetq.operations SET command = $1 WHERE name = 'peek'", [peek])
    start_runner(extra=("--job-user", "nobody", "--work-dir", str(open_work_dir)))
    with connect(fleet_dsn, autocommit=True) as conn:
        job = _submit(conn, "peek", repo.head)
        wait_until(lambda: job_state(conn, job) == "succeeded", what="the job to end")
        row = conn.execute(
            b"SELECT log_tail FROM fleetq.verdicts WHERE job_id = $1", [job]
        ).fetchone()
    assert row is not None
    assert row[0].split() == ["nobody", "DENIED", "DENIED"], row[0]


def test_a_job_user_that_cannot_reach_the_work_dir_is_refused_at_start(
    fleet_dsn: str, tmp_path: Path
) -> None:
    """tmp_path lies under a 0700 directory: say so at start, not at the first job."""
    argv = ["--job-user", "nobody", "--work-dir", str(tmp_path / "work")]
    proc, log = _runner(fleet_dsn, tmp_path, "checks=1", node="node-j", name="r", extra=argv)
    assert proc.wait(timeout=30) == 1
    text = log.read_text()
    assert "--job-user nobody cannot enter" in text and "choose a --work-dir" in text, text


def test_an_unknown_job_user_is_refused(fleet_dsn: str, tmp_path: Path) -> None:
    argv = ["--job-user", "no-such-user-here"]
    proc, log = _runner(fleet_dsn, tmp_path, "checks=1", node="node-j", name="r", extra=argv)
    assert proc.wait(timeout=30) == 1
    assert "no such user" in log.read_text()
