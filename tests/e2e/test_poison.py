"""A job the runner cannot use ends `refused` with its reason; the runner serves on.

Issue 41 (finding 3): one submitter's payload of `[1,2,3]` made every runner of its lane
exit 70 at its claim, and again at each restart. Rows written before submit refused
such payloads still exist, and a claim can be unusable for other reasons (an operation
whose handler cannot be loaded), so the runner refuses the job, never itself
(DESIGN §1.8, §1.9). The bad rows are made as an administrator, straight in SQL.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetq.core.db import SyncConnection, connect
from fleetq.runner import orphans
from tests.e2e import test_runner
from tests.e2e.conftest import Repo, RunnerProcess, StartRunner, job_state, wait_until
from tests.e2e.test_adoption import ADOPT, _launched_without_a_start_report

# as SQL: not an object; and objects Python cannot decode (an integer past its 4,300
# digits, arrays nested past its recursion limit), which made the claim's whole batch
# unreadable and the runner exit, as a list payload once did
BAD_PAYLOADS = (
    "'[1,2,3]'",
    """'"text"'""",
    "'null'",
    "'42'",
    """'{"a":1' || repeat('0', 5000) || '}'""",
    """'{"a":' || repeat('[', 1100) || repeat(']', 1100) || '}'""",
)
# handler specs that name nothing loadable: no such function; no module at all (the
# import machinery answers this one with a ValueError, not an ImportError)
BAD_HANDLERS = {"ghost": "tests.handlers:no_such_handler", "blank": ":nothing"}


def _submit(conn: SyncConnection, operation: str, commit: str) -> int:
    return test_runner._submit(conn, operation, commit, payload={"n": 1})


def _poison(conn: SyncConnection, operation: str, commit: str, payload: str) -> int:
    """A job submitted as any other, whose stored payload is then `payload` (SQL)."""
    job = _submit(conn, operation, commit)
    conn.execute(
        f"UPDATE fleetq.jobs SET payload = ({payload})::jsonb WHERE id = $1".encode(), [job]
    )
    return job


def _bad_handlers(conn: SyncConnection) -> None:
    for name, spec in BAD_HANDLERS.items():
        conn.execute(
            "INSERT INTO fleetq.operations (project, name, lane, handler)"
            " VALUES ('repo', $1, 'control', $2)",
            [name, spec],
        )


def _verdict(conn: SyncConnection, job: int) -> tuple[str, str]:
    row = conn.execute(
        "SELECT verdict, coalesce(reason, '') FROM fleetq.verdicts WHERE job_id = $1", [job]
    ).fetchone()
    assert row is not None, f"job {job} has no verdict"
    return str(row[0]), str(row[1])


def _all_ended(conn: SyncConnection, jobs: list[int], runner: RunnerProcess) -> bool:
    assert runner.proc.poll() is None, f"the runner exited:\n{runner.output()}"
    return all(job_state(conn, j) in ("succeeded", "failed", "refused") for j in jobs)


def test_unusable_claims_are_refused_and_the_runner_serves_on(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    with connect(fleet_dsn, autocommit=True) as conn:
        _bad_handlers(conn)
        # in both lanes, a command's and a handler's, ahead of the good work in the queue,
        # several in one claim's batch
        bad = {
            _poison(conn, operation, repo.old, payload): f"payload {payload}"
            for payload in BAD_PAYLOADS
            for operation in ("check", "ping")
        }
        bad |= {_submit(conn, name, repo.head): f"handler {name}" for name in BAD_HANDLERS}
        runner = start_runner(lanes=("checks=2", "control=2"))
        wait_until(lambda: _all_ended(conn, list(bad), runner), what="the bad jobs to end")
        for job, what in bad.items():
            verdict, reason = _verdict(conn, job)
            assert verdict == "refused", (what, reason)
            assert ("payload" if what.startswith("payload") else "handler") in reason, reason
        good = [_submit(conn, "check", repo.old), _submit(conn, "ping", repo.head)]
        wait_until(lambda: _all_ended(conn, good, runner), what="the good jobs")
        assert [job_state(conn, j) for j in good] == ["succeeded", "succeeded"]
        assert runner.proc.poll() is None, runner.output()
        for job in bad:
            assert f"job={job}" in runner.output()  # each named in a warning


def test_a_refill_that_takes_an_unusable_claim_refuses_it(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    """One control slot: each outcome's batch claims the next job (complete_and_claim),
    so the jobs queued behind the first are taken by refills, good and bad in turn."""
    with connect(fleet_dsn, autocommit=True) as conn:
        jobs: list[int] = []
        for payload in BAD_PAYLOADS:
            jobs.append(_submit(conn, "ping", repo.head))
            jobs.append(_poison(conn, "ping", repo.head, payload))
        jobs.append(_submit(conn, "ping", repo.head))
        runner = start_runner(lanes=("control=1",), extra=("--batch", "1"))
        wait_until(lambda: _all_ended(conn, jobs, runner), what="every job to end")
        verdicts = [_verdict(conn, j)[0] for j in jobs]
        assert verdicts == ["passed", "refused"] * len(BAD_PAYLOADS) + ["passed"]
        assert runner.proc.poll() is None, runner.output()


@pytest.mark.slow
def test_an_adopted_run_whose_row_went_bad_is_stopped_and_refused(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: Path
) -> None:
    """`--orphans adopt`: the restarted runner reads the job's row to follow its run; a
    row it cannot use ends the run and the job, and start-up goes on."""
    release = tmp_path / "release"
    try:
        with connect(fleet_dsn, autocommit=True) as conn:
            job, run_id, _ = _launched_without_a_start_report(conn, repo, start_runner, release)
            conn.execute("UPDATE fleetq.jobs SET payload = '[1,2,3]'::jsonb WHERE id = $1", [job])
            restarted = start_runner(extra=ADOPT)
            wait_until(
                lambda: _all_ended(conn, [job], restarted),
                what="the refusal",
                show=restarted.output,
            )
            verdict, reason = _verdict(conn, job)
            assert verdict == "refused" and "payload must be a JSON object" in reason, reason
            assert not orphans.carrying(run_id), "the run it could not follow was killed"
            good = _submit(conn, "check", repo.old)
            wait_until(lambda: _all_ended(conn, [good], restarted), what="the next job")
            assert job_state(conn, good) == "succeeded"
            assert f"refused job={job}" in restarted.output()
    finally:
        release.touch()  # a run left behind ends
