"""A runner on another node, as an operator sets one up with the embedded server:
`fleetq server start --listen`, a login of its own (`fleetq roles add-runner`), and a
DSN that verifies the server's certificate. Everything a runner does (prepared
statements, LISTEN, cancel of a timed-out call, the runner-id lock) passes through the
TLS front, so a front that broke any of it shows up here."""

from __future__ import annotations

import shutil
import signal
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from fleetq.core import roles
from fleetq.core.db import connect
from fleetq.core.embedded import EmbeddedServer
from tests.conftest import FAST, make_home
from tests.e2e.conftest import Repo, job_state, wait_until
from tests.e2e.test_faults import _fleet, _runner
from tests.e2e.test_runner import _submit

pytestmark = pytest.mark.slow


@pytest.fixture
def listening() -> Iterator[EmbeddedServer]:
    """An embedded server of this test's own, serving TCP through its TLS front."""
    home = make_home()
    server = EmbeddedServer(home, settings=FAST)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server.ensure_running(listen=f"127.0.0.1:{port}")
    yield server
    server.stop()
    shutil.rmtree(home, ignore_errors=True)


def test_a_runner_on_another_node_runs_jobs_over_tls(
    listening: EmbeddedServer, repo: Repo, tmp_path: Path
) -> None:
    dsn = _fleet(listening, repo, tmp_path, lease=30)
    status = listening.status()
    assert status.tcp_dsn is not None and status.listen is not None
    copy = tmp_path / "server.crt"  # what the operator copies to the runner's node
    shutil.copyfile(listening.certificate.file, copy)
    verify = f"sslmode=verify-full&sslrootcert={quote(str(copy))}"
    admin_tcp = status.tcp_dsn.replace("sslmode=require", verify)
    login = f"fq_runner_{uuid.uuid4().hex[:10]}"
    with connect(dsn) as conn:
        created = roles.add(
            conn,
            roles.Kind.RUNNER,
            "node-b/r",
            admin_dsn=admin_tcp,
            password_file=tmp_path / "runner.pgpass",
            login=login,
        )
        conn.commit()
    assert "sslmode=verify-full" in created.dsn and f":{status.listen.rpartition(':')[2]}/" in (
        created.dsn
    )

    runner, log = _runner(created.dsn, tmp_path, "checks=1", "control=1", node="node-b", name="r")
    try:
        with connect(dsn, autocommit=True) as conn:
            passed = _submit(conn, "check", repo.old)
            sleeper = _submit(conn, "sleep", repo.head)
            wait_until(lambda: job_state(conn, passed) == "succeeded", what="the check to pass")
            wait_until(lambda: job_state(conn, sleeper) == "running", what="the sleeper to run")
            conn.execute(b"SELECT * FROM fleetq.cancel($1, 'ops', 'test')", [sleeper])
            wait_until(
                lambda: f"stop confirmed job={sleeper}" in log.read_text(),
                what="the runner to confirm the stop (a NOTIFY through the front)",
            )
            seen = conn.execute(
                b"SELECT count(*) FROM pg_stat_activity WHERE usename = $1", [login]
            ).fetchone()
            assert seen is not None and seen[0] > 0  # it came in over TCP, as its own login
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=60) == 0, log.read_text()
    finally:
        if runner.poll() is None:
            runner.kill()
        with connect(dsn) as conn:
            roles.remove(conn, login)
            conn.commit()
