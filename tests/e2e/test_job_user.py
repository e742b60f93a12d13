"""Jobs cannot read the runner's secrets (issue 13): a job ran as the runner's uid and
read `FLEETQ_DSN=postgresql://…:<password>@…` from `/proc/$PPID/environ`; a root runner
ran jobs as root. With `--job-user` command jobs run as that user. Nor each other's
trees, logs, mirrors or the runner's journal (issue 41): with `--job-uid-range` each
running job has a uid of its own. (Run as root, as CI is: only root can start processes
as another user.)"""

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
    start_runner(
        lanes=("checks=1",), extra=("--job-user", "nobody", "--work-dir", str(open_work_dir))
    )
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


RANGE = (61910, 61913)  # no user has these uids; these tests only

# Each of two jobs says where it is, waits for the other (so both run at once), tries
# the other's tree, home, log, then the runner's journal and mirrors, and says which
# attempts got through. Waits are for a file, with a deadline (exit 7).
PROBE = r"""
S={sync}; R={runner}; me=$1; other=$2
wait_for() {{
  i=0; while [ ! -e "$S/$1" ]; do i=$((i+1)); [ $i -gt 600 ] && exit 7; sleep 0.05; done
}}
echo mine > secret
echo "$PWD" > "$S/$me.tree"; echo "$HOME" > "$S/$me.home"
echo "$FLEETQ_JOB_ID-$FLEETQ_FENCING_TOKEN-${{FLEETQ_RUN_ID%%-*}}" > "$S/$me.name"
echo "uid $(id -u)"; touch "$S/$me.ready"; wait_for "$other.ready"
T=$(cat "$S/$other.tree"); H=$(cat "$S/$other.home"); L="$R/logs/$(cat "$S/$other.name").log"
try() {{ if sh -c "$2" > /dev/null 2>&1; then echo "LEAKED $1"; else echo "DENIED $1"; fi; }}
try read-tree "cat '$T/secret'"
try list-tree "ls '$T'"
try write-tree "touch '$T/intruder'"
try write-home "touch '$H/intruder'"
try read-log "cat '$L'"
try write-log "echo forged >> '$L'"
try read-journal "cat '$R/journal.jsonl'"
try list-mirrors "ls '$R/mirrors'"
try list-trees "ls '$R/trees'"
touch "$S/$me.done"; wait_for "$other.done"
"""


def _set_command(dsn: str, operation: str, command: str) -> None:
    with connect(dsn, autocommit=True) as conn:
        conn.execute(
            b"UPDATE fleetq.operations SET command = $1 WHERE name = $2", [command, operation]
        )


def _log_tail(dsn: str, job: int) -> str:
    with connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            b"SELECT log_tail FROM fleetq.verdicts WHERE job_id = $1", [job]
        ).fetchone()
    assert row is not None
    return str(row[0])


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_two_jobs_at_once_cannot_reach_each_other_nor_the_runner_s_files(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, open_work_dir: Path
) -> None:
    """Jobs on one node shared one job user: a job wrote into another's checkout, read
    another project's mirror, other jobs' logs (0644) and the runner's journal."""
    sync = open_work_dir.parent / "sync"
    sync.mkdir(mode=0o777)
    sync.chmod(0o1777)
    runner_dir = open_work_dir / "node-a__r"
    script = sync / "probe.sh"
    script.write_text(PROBE.format(sync=sync, runner=runner_dir))
    script.chmod(0o644)
    _set_command(fleet_dsn, "peek", f"sh {script} a b")
    _set_command(fleet_dsn, "trace", f"sh {script} b a")
    uids = f"{RANGE[0]}-{RANGE[1]}"
    start_runner(
        lanes=("checks=2",), extra=("--job-uid-range", uids, "--work-dir", str(open_work_dir))
    )
    with connect(fleet_dsn, autocommit=True) as conn:
        jobs = [_submit(conn, "peek", repo.head), _submit(conn, "trace", repo.head)]
        live = ("queued", "claimed", "running")
        wait_until(lambda: all(job_state(conn, j) not in live for j in jobs), what="both jobs")
        states = [job_state(conn, job) for job in jobs]
    tails = [_log_tail(fleet_dsn, job).splitlines() for job in jobs]
    assert states == ["succeeded", "succeeded"], tails
    ran_as = {int(tail[0].split()[1]) for tail in tails}
    assert len(ran_as) == 2 and ran_as <= set(range(RANGE[0], RANGE[1] + 1)), tails
    for tail in tails:
        assert len(tail) == 10 and all(line.startswith("DENIED ") for line in tail[1:]), tail
    logs = runner_dir / "logs"
    assert [_mode(p) for p in (runner_dir, runner_dir / "trees", logs)] == [0o711, 0o711, 0o700]
    assert [_mode(p) for p in (runner_dir / "journal.jsonl", runner_dir / "mirrors")] == [
        0o600,
        0o700,
    ]
    assert {_mode(p) for p in logs.glob("*.log")} == {0o600}


def test_a_uid_goes_to_the_next_job_only_once_nothing_of_the_last_runs(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, open_work_dir: Path
) -> None:
    """A job that times out after leaving a process behind, out of its group and
    without its FLEETQ_RUN_ID: the next job under its uid finds it gone."""
    sync = open_work_dir.parent / "sync"
    sync.mkdir(mode=0o777)
    sync.chmod(0o1777)
    pidfile = sync / "daemon.pid"
    leave = sync / "leave.sh"
    # a session of its own, an environment without FLEETQ_RUN_ID: only its uid says
    # whose it is
    leave.write_text(
        f"setsid env -i sh -c 'echo $$ > {pidfile}; exec sleep 300' &\nexec sleep 300\n"
    )
    _set_command(fleet_dsn, "hang", f"sh {leave}")
    check = sync / "check.sh"
    check.write_text(f"kill -0 $(cat {pidfile}) 2>/dev/null && echo ALIVE || echo GONE\n")
    _set_command(fleet_dsn, "peek", f"sh {check}")
    start_runner(
        lanes=("checks=1",),
        extra=("--job-uid-range", f"{RANGE[0]}-{RANGE[0]}", "--work-dir", str(open_work_dir)),
    )
    with connect(fleet_dsn, autocommit=True) as conn:
        hang = _submit(conn, "hang", repo.head)
        wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), what="the daemon")
        peek = _submit(conn, "peek", repo.head)
        wait_until(lambda: job_state(conn, peek) == "succeeded", what="the next job")
        assert job_state(conn, hang) == "failed"
    assert _log_tail(fleet_dsn, peek).split() == ["GONE"]


def test_a_range_smaller_than_the_slots_is_refused_at_start(fleet_dsn: str, tmp_path: Path) -> None:
    argv = ["--job-uid-range", f"{RANGE[0]}-{RANGE[0] + 1}"]
    proc, log = _runner(fleet_dsn, tmp_path, "checks=2", "control=1", node="node-j", extra=argv)
    assert proc.wait(timeout=30) == 1
    assert "holds 2 uid(s) for 3 slot(s) (checks=2, control=1)" in log.read_text()


def test_a_runner_without_job_users_says_what_its_jobs_can_read(
    start_runner: StartRunner,
) -> None:
    runner = start_runner(lanes=("checks=1",))
    assert "command jobs run as root and can read what the runner reads" in runner.output()
