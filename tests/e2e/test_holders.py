"""Nothing a login holds stops another tenant's job (issue 41). A runner login renewing
another runner's job inside an open transaction, and a submitter holding `submit --after
VICTIM` open, each held the victim's row: its renewals (SKIP LOCKED) skipped it, the
healthy run fenced itself, and the job went back to the queue with a reassignment. A
reader holding the reaper's or a runner id's advisory key stalled expiry or kept the
runner from starting. Here each holds what it can, longer than several leases, while the
victim's job runs and ends; the job must succeed under token 1."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetq.core import config, roles
from fleetq.core.db import SyncConnection, connect
from tests.e2e.conftest import FLEET, Repo, StartRunner, job_state, wait_until
from tests.e2e.test_runner import _submit
from tests.integration.conftest import Login, login  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow

LEASE_S = 3
HOLD_S = 5 * LEASE_S  # the renewal of a lease held up this long would have expired it

Hold = Callable[[SyncConnection, int], None]


def _renew_another_runner_s_job(conn: SyncConnection, job: int) -> None:
    conn.execute(b"SELECT * FROM fleetq.heartbeat('node-x/r9', ARRAY[$1]::bigint[], '{1}')", [job])


def _submit_after_it(conn: SyncConnection, job: int) -> None:
    conn.execute(
        b"SELECT * FROM fleetq.submit('repo', 'check', $1, NULL, NULL, NULL, NULL, '{}', "
        b"ARRAY[$2]::bigint[], NULL)",
        ["c" * 40, job],
    )


def _confirm_its_stop(conn: SyncConnection, job: int) -> None:
    conn.execute(b"SELECT fleetq.confirm_stop('node-x/r9', $1, 1, 9, 'cancelled', NULL)", [job])


def _take_the_advisory_keys(conn: SyncConnection, _job: int) -> None:
    # the reaper's old key, and the old key of the victim's runner id
    conn.execute(b"SELECT pg_advisory_lock(7365657071)")
    conn.execute(b"SELECT pg_advisory_lock(6712433, hashtext('node-a/r'))")


HOLDERS: dict[str, tuple[roles.Kind, str, Hold]] = {
    "runner renews another's job": (roles.Kind.RUNNER, "node-x/r9", _renew_another_runner_s_job),
    "runner confirms another's stop": (roles.Kind.RUNNER, "node-x/r9", _confirm_its_stop),
    "submitter waits on it": (roles.Kind.SUBMITTER, "ci-bot", _submit_after_it),
    "reader takes advisory keys": (roles.Kind.READER, "dashboard", _take_the_advisory_keys),
}


def _short_leases(dsn: str, repo: Repo, tmp_path: Path) -> None:
    path = tmp_path / "short.toml"
    path.write_text(FLEET.format(repo=repo.path, lease=LEASE_S, sleep=2))
    with connect(dsn) as conn:
        config.apply(conn, config.load(path), source=path)
        conn.commit()


def _hold(dsn: str, hold: Hold, job: int, held: threading.Event, release: threading.Event) -> None:
    """Hold, inside a transaction kept busy (a statement a second, so no idle timeout
    ends it), until `release`."""
    with connect(dsn) as conn:
        hold(conn, job)
        held.set()
        while not release.wait(1):
            conn.execute(b"SELECT 1")
        conn.rollback()


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_a_job_survives_what_another_login_holds(
    holder: str,
    fleet_dsn: str,
    repo: Repo,
    start_runner: StartRunner,
    login: Login,  # noqa: F811
    tmp_path: Path,
) -> None:
    kind, subject, hold = HOLDERS[holder]
    _short_leases(fleet_dsn, repo, tmp_path)
    dsn = login(kind, subject)
    held, release = threading.Event(), threading.Event()
    done = tmp_path / "done"
    with connect(fleet_dsn, autocommit=True) as conn:
        if kind is roles.Kind.RUNNER:
            conn.execute(
                b"SELECT fleetq.register_runner('node-x', 'r9', '{}', 1024, 1000, "
                b"ARRAY['checks'], ARRAY[1], 'x', 1)"
            )
        if kind is roles.Kind.READER:  # held before the victim's runner starts
            holding = threading.Thread(target=_hold, args=(dsn, hold, 0, held, release))
            holding.start()
            assert held.wait(30)
        start_runner(lanes=("checks=2",))
        job = _submit(conn, "until", repo.head, payload={"path": str(done)})
        # a handler's run is recorded at its end: its job reads claimed while it runs
        wait_until(lambda: job_state(conn, job) == "claimed", what="the job to run")
        if kind is not roles.Kind.READER:
            holding = threading.Thread(target=_hold, args=(dsn, hold, job, held, release))
            holding.start()
            assert held.wait(30)
        started = time.monotonic()
        try:
            # the job ends while the hold goes on: its outcome too must get through
            wait_until(lambda: time.monotonic() - started > HOLD_S / 2, what="half the hold")
            if kind is roles.Kind.READER:  # expiry still has a leader
                assert _reaper_leads(conn)
            done.touch()
            wait_until(lambda: time.monotonic() - started > HOLD_S, what="the whole hold")
        finally:
            release.set()
            holding.join(30)
        wait_until(lambda: job_state(conn, job) == "succeeded", what="the job to succeed")
        row = conn.execute(
            b"SELECT lease_version, reassign_count FROM fleetq.jobs WHERE id = $1", [job]
        ).fetchone()
        assert row == (1, 0), f"token, reassignments: {row}"


def _reaper_leads(conn: SyncConnection) -> bool:
    row = conn.execute(b"SELECT leader FROM fleetq.reap(1000, NULL)").fetchone()
    return bool(row and row[0])
