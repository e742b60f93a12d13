"""A runner served through `fleetq api` (issue 46): `fleetq-runner --api URL --token-file
F` on a node with no DSN, its token standing for its runner id. The runner is the same
code as one with a DSN; what is tested here is the way in: every statement it makes
passes the gateway (a list of them is all a runner token may run), every rule of a
runner login holds for its token, and wake-ups come from the gateway's one LISTEN
connection by long poll."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetq.core import leasing, roles, tokens
from fleetq.core.db import SyncConnection, connect
from fleetq.core.embeddedtls import Certificate
from fleetq.core.models import FencingToken, JobId, Outcome, OutcomeReport, RunnerId
from fleetq.runner.remote import ApiDriver
from fleetq.runner.reporter import MAX_BATCH
from fleetq.runner.wakes import HOLD_S, RELEASE_S
from tests import pgbouncer
from tests.e2e.conftest import Repo, RunnerProcess, StartRunner, job_state, stop, wait_until
from tests.e2e.test_runner import _submit
from tests.integration.conftest import login_dsn
from tests.integration.test_api import serving
from tests.pgbouncer import PgBouncer

pytestmark = pytest.mark.slow


@pytest.fixture
def gateway_login(fleet_dsn: str, tmp_path: Path) -> Iterator[str]:
    """A gateway login of this test's own: its DSN."""
    name = f"fq_gateway_{uuid.uuid4().hex[:10]}"
    with connect(fleet_dsn, autocommit=True) as conn:
        roles.add(
            conn,
            roles.Kind.GATEWAY,
            "api",
            admin_dsn=fleet_dsn,
            password_file=tmp_path / "gateway.pgpass",
            login=name,
        )
    try:
        yield login_dsn(fleet_dsn, name)
    finally:
        with connect(fleet_dsn, autocommit=True) as conn:
            roles.remove(conn, name)


@pytest.fixture
def gateway(gateway_login: str) -> Iterator[str]:
    """`fleetq api` on a gateway login; its base URL."""
    with serving(gateway_login) as base:
        yield base


def _token(fleet_dsn: str, tmp_path: Path, kind: str, subject: str) -> Path:
    """A token of `kind` for `subject`, in a file of mode 0600."""
    with connect(fleet_dsn) as conn:
        _, secret = tokens.add(
            conn, roles.Kind(kind), subject, name=f"t-{uuid.uuid4().hex[:8]}", created_by="t"
        )
        conn.commit()
    path = tmp_path / f"{uuid.uuid4().hex[:8]}.token"
    tokens.write_secret(path, secret)
    return path


def test_a_runner_with_only_a_url_a_token_and_a_ca_runs_checks(
    fleet_dsn: str, repo: Repo, gateway_login: str, start_runner: StartRunner, tmp_path: Path
) -> None:
    """`fleetq api --tls-cert --tls-key` on a certificate of its own, and a runner that
    trusts its CA (`--api-ca`): the only things of the queue's on the runner's node are a
    URL, a token and a CA file. One that does not trust it stops at start, saying so."""
    cert = Certificate(tmp_path / "api.crt", tmp_path / "api.key", workdir=tmp_path, as_root=False)
    cert.ensure("127.0.0.1")
    token = _token(fleet_dsn, tmp_path, "runner", "node-a/r")
    tls = ("--tls-cert", str(cert.file), "--tls-key", str(cert.key_file))
    with (
        serving(gateway_login, *tls, verify=str(cert.file)) as base,
        connect(fleet_dsn, autocommit=True) as conn,
    ):
        assert base.startswith("https://")
        via = ("--api", base, "--token-file", str(token))
        elsewhere = ("--work-dir", str(tmp_path / "x"))
        untrusting = start_runner(via=via, extra=elsewhere, expect_exit=True)
        assert untrusting.proc.returncode == 1, untrusting.output()
        assert "is not trusted (self-signed certificate)" in untrusting.output()
        assert "--api-ca" in untrusting.output()
        env = {"FLEETQ_DSN": "", "PGPASSFILE": os.devnull}  # nothing of the database here
        runner = start_runner(via=(*via, "--api-ca", str(cert.file)), env=env)
        _runs_checks(conn, repo, runner)
    assert runner.proc.poll() is None, runner.output()


def _runs_checks(conn: SyncConnection, repo: Repo, runner: RunnerProcess) -> None:
    """A passing and a failing check, a cancel heard, a handler that needs a session."""
    passed = _submit(conn, "check", repo.old)
    failed = _submit(conn, "check", repo.head)
    wait_until(
        lambda: job_state(conn, passed) == "succeeded",
        what="the check to pass",
        show=runner.output,
    )
    wait_until(lambda: job_state(conn, failed) == "failed", what="the check to fail")
    result = conn.execute(
        b"SELECT verdict, commit_sha FROM fleetq.results WHERE job_id = $1", [passed]
    ).fetchone()
    assert result == ("passed", repo.old)
    # a cancel reaches the runner as a notice the gateway heard and passed on
    sleeper = _submit(conn, "sleep", repo.head)
    wait_until(lambda: job_state(conn, sleeper) == "running", what="the sleeper to run")
    conn.execute(b"SELECT * FROM fleetq.cancel($1, 'ops', 'test')", [sleeper])
    wait_until(
        lambda: f"stop confirmed job={sleeper}" in runner.output(),
        what="the runner to confirm the stop",
        show=runner.output,
    )
    # a handler that needs a database session says so, and nothing else is harmed
    effect = _submit(conn, "exactly_once", repo.head)
    wait_until(lambda: job_state(conn, effect) == "failed", what="the handler job to end")
    said = conn.execute(
        b"SELECT reason, log_tail FROM fleetq.results WHERE job_id = $1", [effect]
    ).fetchone()
    assert "served through the API" in str(said), said


def test_a_runner_token_acts_as_its_runner_only_and_in_one_process(
    fleet_dsn: str, gateway: str, start_runner: StartRunner, tmp_path: Path
) -> None:
    token = _token(fleet_dsn, tmp_path, "runner", "node-a/r")
    via = ("--api", gateway, "--token-file", str(token))
    other = start_runner("node-b", "r", via=via, expect_exit=True)
    assert other.proc.returncode != 0
    assert "acts as runner node-a/r only, not as node-b/r" in other.output(), other.output()
    first = start_runner(via=via)
    # the same token in a second process (another directory, as on another node): refused
    # while the first holds the runner id, naming it; the first serves on
    second = start_runner(
        via=via, extra=("--work-dir", str(tmp_path / "elsewhere")), expect_exit=True
    )
    assert second.proc.returncode != 0
    assert "already served by another process (fleetq-runner --api on" in second.output(), (
        second.output()
    )
    assert first.proc.poll() is None, first.output()
    # another process took the id meanwhile (the first's hold ran out, a partition say):
    # the first's next renewal finds it and the first stops, leaving the id to it
    with connect(fleet_dsn, autocommit=True) as conn:
        conn.execute(
            b"UPDATE fleetq.coordination SET holder_until = clock_timestamp() "
            b"WHERE name = 'runner:node-a/r'"
        )
        conn.execute(b"SELECT * FROM fleetq.hold_runner_id('node-a/r', 'an intruder', 60)")
    wait_until(lambda: first.proc.poll() is not None, what="the displaced runner to stop")
    assert first.proc.returncode == 1, first.output()
    assert "no longer owns it" in first.output()


def test_a_clean_stop_lets_the_runner_id_go_in_seconds(
    fleet_dsn: str, gateway: str, start_runner: StartRunner, tmp_path: Path
) -> None:
    """A runner through the API that stops cleanly (every run ended, every lease given
    back) shortens its hold to RELEASE_S: a process elsewhere serves seconds later, not
    HOLD_S after the last renewal."""
    token = _token(fleet_dsn, tmp_path, "runner", "node-a/r")
    via = ("--api", gateway, "--token-file", str(token))
    first = start_runner(via=via)
    stop(first)
    assert first.proc.returncode == 0, first.output()

    def left() -> float:
        with connect(fleet_dsn, autocommit=True) as conn:
            row = conn.execute(
                b"SELECT extract(epoch FROM holder_until - clock_timestamp())::float8 "
                b"FROM fleetq.coordination WHERE name = 'runner:node-a/r'"
            ).fetchone()
        assert row is not None
        return float(str(row[0]))

    assert left() <= RELEASE_S < HOLD_S
    wait_until(lambda: left() <= 0, what="the shortened hold to run out")
    second = start_runner(via=via, extra=("--work-dir", str(tmp_path / "elsewhere")))
    assert second.proc.poll() is None, second.output()


def test_the_runner_endpoints_serve_runner_tokens_and_runner_statements_only(
    fleet_dsn: str, gateway: str, tmp_path: Path
) -> None:
    submitter = _token(fleet_dsn, tmp_path, "submitter", "ci").read_text().strip()
    runner = _token(fleet_dsn, tmp_path, "runner", "node-a/r").read_text().strip()
    with httpx.Client(base_url=gateway, timeout=10) as client:

        def call(secret: str, name: str, *args: object) -> httpx.Response:
            return client.post(
                "/v1/runner/calls",
                json={"name": name, "args": list(args)},
                headers={"Authorization": f"Bearer {secret}"},
            )

        # a runner's limit (16 MiB) is for what looks like a runner's call; an anonymous
        # body meets the producers' (an anonymous 13-MiB body held the API for seconds)
        padding = "x" * 300_000
        anonymous = client.post("/v1/runner/calls", json={"name": "views_now", "args": [padding]})
        assert anonymous.status_code == 413, anonymous.text
        assert call(runner, "views_now", padding).status_code == 400  # read, then refused
        refused = call(submitter, "runners_lease_seconds")
        assert refused.status_code == 403, refused.text
        assert "not a runner's" in refused.json()["error"]["message"]
        assert call(runner, "runners_lease_seconds").status_code == 200
        # a statement the gateway may run, but no runner makes: not served
        listed = call(runner, "runners_list")
        assert listed.status_code == 400 and "not a statement a runner makes" in listed.text
        # a malformed argument is bad input, not a crash
        bad = call(runner, "lease_job_states", "node-a/r", {"$t": "yesterday"})
        assert bad.status_code == 400, bad.text
        wrong = call(runner, "lease_job_states", "node-a/r", "not an array")
        assert wrong.status_code == 400, wrong.text
        woken = client.get(
            "/v1/runner/wake",
            params={"wait_s": 0},
            headers={"Authorization": f"Bearer {submitter}"},
        )
        assert woken.status_code == 403


def test_a_notice_reaches_a_runner_by_long_poll_and_a_gap_is_said(
    fleet_dsn: str, gateway: str, tmp_path: Path
) -> None:
    secret = _token(fleet_dsn, tmp_path, "runner", "node-a/r").read_text().strip()
    headers = {"Authorization": f"Bearer {secret}"}
    with (
        httpx.Client(base_url=gateway, timeout=15, headers=headers) as client,
        connect(fleet_dsn, autocommit=True) as conn,
    ):

        def wake(after: str | None, wait_s: float) -> dict[str, Any]:
            params: dict[str, Any] = {"wait_s": wait_s, **({"after": after} if after else {})}
            answer = client.get("/v1/runner/wake", params=params)
            assert answer.status_code == 200, answer.text
            return dict(answer.json())

        first = wake(None, 0)
        assert first["gap"] and not first["notices"]  # no cursor: look at everything once
        # a cursor of another API process (behind the same load balancer): its numbers
        # mean nothing here, so all may have been missed
        assert wake("another-process:" + first["next"].partition(":")[2], 0)["gap"]
        cursor, heard = first["next"], list[dict[str, str]]()
        deadline = time.monotonic() + 30
        while not heard and time.monotonic() < deadline:
            conn.execute(b"SELECT pg_notify('fleetq_control', 'job:77')")
            answer = wake(cursor, 5)
            cursor = answer["next"]
            if not answer["gap"]:  # a gap: the gateway's LISTEN came up after the cursor
                heard = answer["notices"]
        assert {"channel": "fleetq_control", "payload": "job:77"} in heard
        assert wake(cursor, 0) == {"next": cursor, "notices": [], "gap": False}
        # no hint of fleetq's is that long (any login may NOTIFY: every runner would get
        # it); a cursor that is no number is another process's, not a 500
        conn.execute(b"SELECT pg_notify('fleetq_work', repeat('x', 400))")
        conn.execute(b"SELECT pg_notify('fleetq_control', 'job:78')")
        later = wake(cursor, 5)
        assert later["notices"] == [{"channel": "fleetq_control", "payload": "job:78"}], later
        assert wake(cursor.partition(":")[0] + ":\u00b2", 0)["gap"]


def test_the_api_pools_through_pgbouncer_in_transaction_mode(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: Path
) -> None:
    """`fleetq api --pgbouncer`: its pool through PgBouncer in transaction mode (no
    prepared statement outlives a request's transaction), its LISTEN connection straight
    to PostgreSQL (`--session-dsn`); runners through it run checks and hear cancels, on
    at most PgBouncer's pool of server connections."""
    pgbouncer.require()
    bouncer = PgBouncer(fleet_dsn, pool_size=2)
    bouncer.start()
    try:
        via_bouncer = ("--pgbouncer", "--session-dsn", fleet_dsn, "--pool-size", "20")
        with serving(bouncer.dsn, *via_bouncer) as base:
            for name in ("r", "s"):
                token = _token(fleet_dsn, tmp_path, "runner", f"node-a/{name}")
                start_runner(
                    "node-a",
                    name,
                    via=("--api", base, "--token-file", str(token)),
                    extra=("--work-dir", str(tmp_path / name)),
                )
            # many requests at once, several statements: each lands on whichever server
            # connection PgBouncer lends its transaction, where no statement of another's
            # is prepared (with asyncpg's statement cache on, these fail)
            secret = _token(fleet_dsn, tmp_path, "runner", "node-a/t").read_text().strip()
            calls = ["runners_lease_seconds", "lease_operations", "views_now"] * 20
            with (
                httpx.Client(base_url=base, timeout=30) as client,
                ThreadPoolExecutor(max_workers=12) as pool,
            ):
                answers = list(
                    pool.map(
                        lambda name: (
                            client.post(
                                "/v1/runner/calls",
                                json={"name": name},
                                headers={"Authorization": f"Bearer {secret}"},
                            ).status_code
                        ),
                        calls,
                    )
                )
            assert answers == [200] * len(calls), answers
            with connect(fleet_dsn, autocommit=True) as conn:
                checks = [_submit(conn, "check", repo.old) for _ in range(6)]
                wait_until(
                    lambda: all(job_state(conn, job) == "succeeded" for job in checks),
                    what="the checks to pass through PgBouncer",
                )
                sleeper = _submit(conn, "sleep", repo.head)
                wait_until(lambda: job_state(conn, sleeper) == "running", what="a sleeper")
                conn.execute(b"SELECT * FROM fleetq.cancel($1, 'ops', 'test')", [sleeper])
                wait_until(
                    lambda: (
                        job_state(conn, sleeper) == "cancelled"
                        and conn.execute(
                            b"SELECT stop_confirmed FROM fleetq.executions WHERE job_id = $1",
                            [sleeper],
                        ).fetchone()
                        == (True,)
                    ),
                    what="the cancel heard and the stop confirmed",
                )
                (api_sessions,) = conn.execute(
                    b"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    b"AND backend_type = 'client backend' AND pid <> pg_backend_pid() "
                    b"AND application_name <> 'fleetq-api-listen'"
                ).fetchone() or (0,)
                assert api_sessions <= 2, api_sessions  # PgBouncer's pool, not the API's 20
    finally:
        bouncer.close()


async def test_a_full_outcome_batch_passes_the_api(
    fleet_dsn: str, gateway: str, tmp_path: Path
) -> None:
    """The runner's outcome writer sends up to 256 outcomes at once, each with a 4-KiB log
    tail (JSON writes a control character as six bytes): such a batch passes, where the
    producers' body limit (256 KiB) refused it at every retry. (Past the runners' own
    limit a body is refused with 413: test_api's contract test.)"""
    secret = _token(fleet_dsn, tmp_path, "runner", "node-a/r").read_text().strip()
    driver = ApiDriver(gateway, secret)
    try:
        outcomes = [
            OutcomeReport(
                job_id=JobId(BIG_JOB - n),
                lease_version=FencingToken(1),
                outcome=Outcome.FAILED,
                exit_code=1,
                log_tail="\x01" * 4096,
            )
            for n in range(MAX_BATCH)
        ]
        answers = await leasing.complete_many(
            driver, runner=RunnerId("node-a/r"), outcomes=outcomes
        )
        assert len(answers) == MAX_BATCH  # stale, each: no such lease, but answered
    finally:
        await driver.close()


BIG_JOB = 2**62
