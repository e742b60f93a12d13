"""A PostgreSQL failover under a working fleet (docs/operations.md, "Failover").

A primary with one streaming standby, three runner processes and a producer whose DSN
lists both hosts; jobs flow; the primary's machine dies (every process of it SIGKILLed)
and the standby is promoted. With synchronous replication nothing acknowledged is lost:
every acknowledged submit is on the new primary, every job ends with exactly one outcome,
no job's token goes backwards, the leases held at the failover are recovered (their
runner carries on under the same token, or the lease expires and the job runs again), and
no runner exits. With asynchronous replication what the standby had not received is
gone, acknowledged or not: the second test shows it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psycopg
import pytest

from fleetq.core import config as fleet_config
from fleetq.core import migrate, producer, roles, tokens
from fleetq.core.db import connect, writable
from fleetq.core.errors import ConnectionFailed
from tests.console.conftest import SIZE, console, show, until
from tests.console.test_live import _listed
from tests.e2e.conftest import FLEET, Repo, wait_until
from tests.e2e.test_faults import _runner
from tests.faults.replication import Pair, replicated_pair
from tests.integration.test_api import serving

pytestmark = pytest.mark.slow

LEASE_S = 4
RUNNERS = 3
FENCE = re.compile(r"self-fencing job=(\d+) token=(\d+)")
TERMINAL = ["succeeded", "failed", "cancelled", "refused"]


class Producer(threading.Thread):
    """Submits jobs one by one, each under an idempotency key, through the two-host DSN;
    a submit that fails (the primary is gone, the standby not yet promoted) is sent again
    under the same key until it is acknowledged. `acked` is every acknowledged submit."""

    def __init__(self, dsn: str, commit: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.commit = writable(dsn), commit
        self.stop = threading.Event()
        self.acked: dict[str, int] = {}  # idempotency key -> job id
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def count(self) -> int:
        with self.lock:
            return len(self.acked)

    def run(self) -> None:
        conn: psycopg.Connection[tuple[object, ...]] | None = None
        n = 0
        while not self.stop.is_set():
            key = f"failover-{n}"
            try:
                if conn is None:
                    conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
                result = producer.submit_in_transaction(
                    conn,
                    project="repo",
                    operation="sleep" if n % 4 == 0 else "ping",
                    commit=self.commit,
                    submitted_by="failover-test",
                    idempotency_key=key,
                )
            except (ConnectionFailed, psycopg.OperationalError) as exc:
                self.errors.append(str(exc).splitlines()[0])
                if conn is not None:
                    conn.close()
                    conn = None
                self.stop.wait(0.1)  # pacing the retries, not waiting for anything
                continue
            with self.lock:
                self.acked[key] = result.job_id
            n += 1
            self.stop.wait(0.05)  # about 20 submits a second
        if conn is not None:
            conn.close()


@contextmanager
def fleet(
    pair: Pair, repo: Repo, tmp_path: Path, sleep: int = 1, dsn: str | None = None
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The schema and the fleet file on the primary, and three runners on the two-host
    DSN, each serving before the block starts; stopped afterwards."""
    migrate.migrate(pair.primary.dsn())
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET.format(repo=repo.path, lease=LEASE_S, sleep=sleep))
    with connect(pair.primary.dsn()) as conn:
        fleet_config.apply(conn, fleet_config.load(path), source=path)
    runners = [
        _runner(dsn or pair.fleet_dsn, tmp_path, "checks=2", "control=2", name=f"r{i}")
        for i in range(RUNNERS)
    ]
    try:
        for proc, log in runners:

            def serving(proc: subprocess.Popen[bytes] = proc, log: Path = log) -> bool:
                return "serving" in log.read_text() or proc.poll() is not None

            wait_until(serving, what=f"{log.name} to serve")
            assert proc.poll() is None, log.read_text()
        yield [proc for proc, _ in runners]
    finally:
        for proc, _ in runners:
            proc.terminate()
        for proc, _ in runners:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _rows(dsn: str, sql: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(
        dsn, autocommit=True, connect_timeout=5, cursor_factory=psycopg.RawCursor
    ) as conn:
        cursor = conn.execute(sql.encode(), list(params))
        return cursor.fetchall() if cursor.description else []


def _ints(dsn: str, sql: str, *params: object) -> dict[int, int]:
    """A query's rows of two integers, as a mapping from the first to the second."""
    return {int(str(a)): int(str(b)) for a, b in _rows(dsn, sql, *params)}


def _fences(tmp_path: Path) -> set[tuple[int, int]]:
    """Every (job, token) a runner logged that it fenced itself from."""
    found = (FENCE.findall(log.read_text()) for log in tmp_path.glob("*.log"))
    return {(int(job), int(token)) for pairs in found for job, token in pairs}


def _live_sleep_jobs(dsn: str) -> int:
    (row,) = _rows(
        dsn,
        "SELECT count(*) FROM fleetq.jobs WHERE operation = 'sleep' "
        "AND state IN ('claimed', 'running')",
    )
    return int(str(row[0]))


@pytest.mark.parametrize("outage", ["brief", "longer than the lease"])
def test_a_synchronous_standby_takes_over_and_nothing_acknowledged_is_lost(
    outage: str, repo: Repo, tmp_path: Path
) -> None:
    """`brief`: the standby is promoted at once, and the runners carry on under their
    tokens. `longer than the lease`: it is promoted only once every runner that held a
    lease has fenced itself (stopped its runs: no primary renewed them), so those jobs
    run again under new tokens."""
    # long enough to be running at the fence: a runner fences up to a lease (4 s) after
    # the kill, and a check job running at the snapshot may have started a second or two
    # before it (6 s left half a second of margin: a slow machine's CI once had every held
    # check job end before its runner fenced, and nothing to fence)
    sleep = 1 if outage == "brief" else 10
    with replicated_pair(sync=True) as pair, fleet(pair, repo, tmp_path, sleep) as runners:
        submits = Producer(pair.fleet_dsn, repo.head)
        submits.start()
        try:
            wait_until(
                lambda: submits.count() >= 12 and _live_sleep_jobs(pair.primary.dsn()) >= 2,
                what="jobs flowing, with check jobs running",
            )
            # What the old primary had handed out: each job's newest token, and the leases
            # held at this moment (a commit returned only once the standby had it).
            old = pair.primary.dsn()
            handed_out = _ints(old, "SELECT id, lease_version FROM fleetq.jobs")
            live = "state IN ('claimed', 'running')"
            held = _ints(old, f"SELECT id, lease_version FROM fleetq.jobs WHERE {live}")
            # the runners of the check jobs running now: each will fence one (a handler
            # job or a run that has ended has nothing to fence)
            owners = _rows(
                old,
                "SELECT DISTINCT lease_owner FROM fleetq.jobs "
                "WHERE state = 'running' AND operation = 'sleep'",
            )
            holders = {str(owner).replace("/", "-") for (owner,) in owners}
            killed_at = time.time()
            pair.primary.kill()
            if outage != "brief":
                for holder in holders:

                    def fenced_itself(log: Path = tmp_path / f"{holder}.log") -> bool:
                        return "self-fencing" in log.read_text()

                    wait_until(fenced_itself, what=f"{holder} to fence itself")
            pair.standby.promote()
            promoted_s = time.time() - killed_at
            new = pair.standby.dsn()
            before = submits.count()
            wait_until(
                lambda: submits.count() >= before + 12,
                what="submits acknowledged by the new primary",
                deadline_s=60,
            )
        finally:
            submits.stop.set()
            submits.join(timeout=30)
        acked = dict(submits.acked)
        wait_until(
            lambda: (
                not _rows(
                    new,
                    "SELECT 1 FROM fleetq.jobs WHERE NOT (state = ANY($1)) LIMIT 1",
                    TERMINAL,
                )
            ),
            what="every job to reach an outcome on the new primary",
            deadline_s=90,
        )
        keys = {
            str(key): int(str(job))
            for key, job in _rows(new, "SELECT idempotency_key, id FROM fleetq.jobs")
        }
        missing = {key: job for key, job in acked.items() if keys.get(key) != job}
        assert not missing, f"acknowledged submits lost in the failover: {missing}"
        rows = _rows(new, "SELECT id, state FROM fleetq.jobs")
        states = {int(str(job)): str(state) for job, state in rows}
        outcomes = _ints(
            new,
            "SELECT job_id, count(*) FROM fleetq.events "
            "WHERE kind IN ('succeeded', 'failed') GROUP BY job_id",
        )
        wrong = {
            job: (state, outcomes.get(job, 0))
            for job, state in states.items()
            if state not in ("succeeded", "failed") or outcomes.get(job, 0) != 1
        }
        assert not wrong, f"jobs without exactly one outcome (state, outcomes): {wrong}"
        now = _ints(new, "SELECT id, lease_version FROM fleetq.jobs")
        backwards = {job: (t, now[job]) for job, t in handed_out.items() if now[job] < t}
        assert not backwards, f"tokens that went backwards (old, new): {backwards}"
        assert held, "no lease was held at the failover: the test proved nothing"
        adopted = [job for job, token in held.items() if now[job] == token]
        rerun = [job for job, token in held.items() if now[job] > token]
        runs = _rows(
            new,
            "SELECT job_id, lease_version, stop_reason, exit_code FROM fleetq.executions "
            "WHERE job_id = ANY($1)",
            list(held),
        )
        # a run whose process had ended and whose outcome waited for the database has
        # nothing to stop: fenced, it was recorded as stopped (and could have run again)
        ended_then_fenced = [j for j, _, why, code in runs if why == "self_fenced" and code == 0]
        assert not ended_then_fenced, "runs that had ended were fenced"
        # The fences, as the runners logged them (a job claimed between the snapshot and
        # the kill may be among them). Each is reported once the database answers, the
        # report retried until then, and kept as a `stopped` event (a run whose start
        # report was lost has no execution row to carry it): `self_fenced`, or
        # `superseded` when the job had moved on first (its lease expired on the new
        # primary and a runner, maybe the same one, claimed it again before the fenced
        # runner reported: the later truth wins, see Leases.confirm).
        fences = _fences(tmp_path)
        stops_sql = (
            "SELECT job_id, lease_version, detail->>'reason' FROM fleetq.events "
            "WHERE kind = 'stopped'"
        )

        def stops() -> dict[tuple[int, int], str]:
            rows = _rows(new, stops_sql)
            return {(int(str(job)), int(str(t))): str(why) for job, t, why in rows}

        wait_until(lambda: fences <= stops().keys(), what="every fence reported")
        recorded = stops()
        wrong_stop = {
            fence: recorded[fence]
            for fence in fences
            if recorded[fence] not in ("self_fenced", "superseded")
        }
        assert not wrong_stop, f"fences reported as something else (job, token): {wrong_stop}"
        assert all(now[job] > token for job, token in fences), "a fenced run went on"
        if outage != "brief":
            assert fences, "no run was fenced: the outage did not outlast the lease"
        for proc in runners:
            assert proc.poll() is None, "a runner exited during the failover"
        # The recovery delay: from the kill to the first claim the new primary committed.
        # Its events are those stamped after the last transaction the standby replayed
        # (an event's time is taken before its transaction commits).
        (first_claim,) = _rows(
            new,
            "SELECT extract(epoch FROM min(at)) FROM fleetq.events "
            "WHERE kind = 'claimed' AND at > pg_last_xact_replay_timestamp()",
        )[0]
        recovered_s = float(str(first_claim)) - killed_at
        print(
            f"\nfailover: promoted {promoted_s:.2f}s after the kill; first claim on the new "
            f"primary {recovered_s:.2f}s after it; {len(acked)} submits acknowledged, "
            f"{len(submits.errors)} failed and sent again; leases held at the kill: "
            f"{len(held)} ({len(adopted)} carried on under their token, {len(rerun)} ran "
            f"again after their lease expired); fences: "
            f"{sorted(recorded[fence] for fence in fences)}"
        )


def test_an_asynchronous_standby_loses_what_it_had_not_received(repo: Repo, tmp_path: Path) -> None:
    """The primary's WAL sender is stopped (SIGSTOP) while submits are acknowledged by
    the primary alone; the primary dies; those submits are not on the promoted standby.
    What the docs say asynchronous replication can lose, shown. (Stopping the standby's
    receiver instead would not do: the WAL sent meanwhile waits in its socket.)"""
    with replicated_pair(sync=False) as pair:
        migrate.migrate(pair.primary.dsn())
        path = tmp_path / "fleet.toml"
        path.write_text(FLEET.format(repo=repo.path, lease=LEASE_S, sleep=1))
        with connect(pair.primary.dsn()) as conn:
            fleet_config.apply(conn, fleet_config.load(path), source=path)

        replicated = _submit(pair.fleet_dsn, repo.head, "replicated")
        standby = pair.standby.dsn()
        wait_until(
            lambda: _rows(standby, "SELECT 1 FROM fleetq.jobs WHERE id = $1", replicated),
            what="the first submit to reach the standby",
        )
        os.kill(pair.walsender_pid(), signal.SIGSTOP)  # SIGKILL ends it stopped or not
        unreplicated = [_submit(pair.fleet_dsn, repo.head, f"unreplicated-{n}") for n in range(3)]
        pair.primary.kill()
        pair.standby.promote()
        found = {int(str(job)) for (job,) in _rows(standby, "SELECT id FROM fleetq.jobs")}
        assert replicated in found
        lost = [job for job in unreplicated if job not in found]
        assert lost == unreplicated, (
            f"acknowledged submits that the standby never received are on it: {found}"
        )
        print(f"\nasynchronous failover lost {len(lost)} acknowledged submits, as documented")


def test_a_switchover_moves_the_runners_off_the_fenced_primary(repo: Repo, tmp_path: Path) -> None:
    """A planned switchover: the operator fences the primary (`default_transaction_read_only`,
    reloaded: it stays up, refusing writes), the standby catches up and is promoted. The
    runners' pooled connections and LISTEN session are still on the old server, which
    answers every write with "read-only transaction": each is dropped at its next use
    and remade on the new primary (`server_guard`), so jobs submitted after the
    switchover run. Kept, the runners would fail every claim until the old server stopped."""
    with replicated_pair(sync=False) as pair, fleet(pair, repo, tmp_path) as runners:
        first = _submit(pair.fleet_dsn, repo.head, "before")
        wait_until(lambda: _state(pair.primary.dsn(), first) == "succeeded", what="a job before")
        old, new = pair.primary.dsn("postgres"), pair.standby.dsn()
        _rows(old, "ALTER SYSTEM SET default_transaction_read_only = on")
        _rows(old, "SELECT pg_reload_conf()")
        ((fenced_at,),) = _rows(old, "SELECT pg_current_wal_lsn()::text")
        wait_until(
            lambda: _rows(new, "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", fenced_at)[0][
                0
            ],
            what="the standby to replay everything the old primary wrote",
        )
        pair.standby.promote()
        after = [_submit(pair.fleet_dsn, repo.head, f"after-{n}") for n in range(3)]
        wait_until(
            lambda: all(_state(new, job) == "succeeded" for job in after),
            what="jobs submitted after the switchover to run on the new primary",
        )
        for proc in runners:
            assert proc.poll() is None, "a runner exited during the switchover"
        logs = "".join(p.read_text() for p in tmp_path.glob("n-r*.log"))
        assert "read-only" in logs, "no runner said it had reached a read-only server"


def _submit(dsn: str, commit: str, key: str) -> int:
    with psycopg.connect(writable(dsn), autocommit=True, connect_timeout=5) as conn:
        return producer.submit_in_transaction(
            conn,
            project="repo",
            operation="ping",
            commit=commit,
            submitted_by="failover-test",
            idempotency_key=key,
        ).job_id


def _state(dsn: str, job: int) -> str:
    return str(_rows(dsn, "SELECT state FROM fleetq.jobs WHERE id = $1", job)[0][0])


async def test_the_console_cli_and_api_follow_the_failover(repo: Repo, tmp_path: Path) -> None:
    """The operator's tools on the two-host DSN: the console goes stale when the primary
    dies and is live again on the promoted standby, showing a job submitted there; the
    CLI (a connection per command) and the HTTP API (a pool) submit there."""
    with replicated_pair(sync=True) as pair:
        migrate.migrate(pair.primary.dsn())
        path = tmp_path / "fleet.toml"
        path.write_text(FLEET.format(repo=repo.path, lease=LEASE_S, sleep=1))
        with connect(pair.primary.dsn(), autocommit=True) as admin:
            fleet_config.apply(admin, fleet_config.load(path), source=path)
            _, secret = tokens.add(admin, roles.Kind.SUBMITTER, "ci", name="ci", created_by="t")
        dsn = writable(pair.fleet_dsn)  # what resolve_dsn hands the console
        body = {"project": "repo", "operation": "ping", "commit": repo.head}
        auth = {"Authorization": f"Bearer {secret}"}
        app = console(dsn, live=True, clock=None, resync_s=600)
        argv = [sys.executable, "-m", "fleetq", "--dsn", pair.fleet_dsn, "submit", "repo", "ping"]
        argv += ["--commit", repo.head, "--key", "after-failover", "--json"]
        with serving(pair.fleet_dsn) as base:
            async with httpx.AsyncClient(base_url=base, timeout=10) as api:
                assert (await api.post("/v1/jobs", json=body, headers=auth)).status_code == 201
                async with app.run_test(size=SIZE) as pilot:
                    await show(pilot, "3")
                    await until(pilot, lambda: app.follower.connected.is_set())
                    pair.primary.kill()
                    await until(pilot, lambda: app.outages == 1, deadline=30)
                    await asyncio.to_thread(pair.standby.promote)
                    cli = await asyncio.to_thread(
                        subprocess.run, argv, capture_output=True, text=True, timeout=60
                    )
                    assert cli.returncode == 0, cli.stderr
                    job = int(json.loads(cli.stdout)["job_id"])
                    await until(
                        pilot,
                        lambda: app.stale_since is None and app.follower.connected.is_set(),
                        deadline=30,
                    )
                    await until(pilot, lambda: _listed(app, job), deadline=30)
                    # the API's pool: its connections to the dead primary are replaced
                    deadline = time.monotonic() + 30
                    while (await api.post("/v1/jobs", json=body, headers=auth)).status_code != 201:
                        assert time.monotonic() < deadline, "the API did not submit after failover"
                        await pilot.pause(0.1)


@pytest.mark.long
def test_runners_pass_over_a_primary_that_hangs(repo: Repo, tmp_path: Path) -> None:
    """The primary's machine hangs (every process of it stopped: connections neither
    answer nor are refused) and the standby is promoted. The runners, on a DSN that lists
    the hung primary first, give up on it and run new jobs on the promoted standby: each
    host gets a timeout of its own (`connect_each_host`). asyncpg alone spends its whole
    timeout on the first host and never tries the next, so they never came back.
    Opt-in (`-m long`): the runners first wait out their calls' 30 s timeouts on the hung
    primary (60 s in all here); tests/integration/test_hosts.py holds the mechanism."""
    with (
        replicated_pair(sync=False) as pair,
        fleet(pair, repo, tmp_path, dsn=pair.primary_first_dsn) as runners,
    ):
        before = _submit(pair.primary.dsn(), repo.head, "before")
        wait_until(lambda: _state(pair.primary.dsn(), before) == "succeeded", what="a job")
        pair.primary.freeze()
        try:
            pair.standby.promote()
            frozen_at = time.monotonic()
            new = pair.standby.dsn()
            after = _submit(new, repo.head, "after")
            wait_until(
                lambda: _state(new, after) == "succeeded",
                what="a job on the promoted standby",
                deadline_s=120,
            )
            took = time.monotonic() - frozen_at
            print(f"\nhung primary passed over: a job submitted then ran within {took:.1f}s")
            for proc in runners:
                assert proc.poll() is None, "a runner exited while the primary hung"
        finally:
            pair.primary.kill()
