"""Debian's PgBouncer in transaction mode in front of a test's PostgreSQL (issue 46: the
API's pool through it). Tests that need it skip when `pgbouncer` is not installed; CI
installs it (.ci/run). The scale benchmark has its own (bench/fleetq_bench/pgbouncer.py):
the tests' environment has no bench package, and the bench project no tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from fleetq.core.embeddedhost import ensure_server_user
from tests.e2e.conftest import wait_until

BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def require() -> None:
    """Skip the test unless PgBouncer is installed (`apt-get install pgbouncer`)."""
    if not Path(BINARY).exists():
        pytest.skip("PgBouncer is not installed (apt-get install pgbouncer)")


class PgBouncer:
    """One PgBouncer process, transaction pooling, `pool_size` server connections per
    database and user at most, trusting every client (a test's own machine)."""

    def __init__(self, dsn: str, *, pool_size: int = 5) -> None:
        parts = urlsplit(dsn)
        query = parse_qs(parts.query)
        self.host = (query.get("host") or [parts.hostname or "127.0.0.1"])[0]
        self.server_port = int((query.get("port") or [str(parts.port or 5432)])[0])
        self.database = parts.path.lstrip("/") or "postgres"
        self.user = parts.username or "postgres"
        # its own directory: as root, PgBouncer runs as the embedded server's user (it
        # refuses root), which must write its log and reach the server's socket
        self.directory = Path(tempfile.mkdtemp(prefix="fleetq-pgbouncer-"))
        self.user_flag: list[str] = []
        if os.geteuid() == 0:
            server_user = ensure_server_user()
            os.chown(self.directory, server_user.pw_uid, server_user.pw_gid)
            self.user_flag = ["-u", server_user.pw_name]
        self.pool_size = pool_size
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.log = self.directory / "pgbouncer.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._configure()

    @property
    def dsn(self) -> str:
        """The DSN's database, through PgBouncer."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    def _configure(self) -> None:
        (self.directory / "users.txt").write_text(f'"{self.user}" ""\n')
        (self.directory / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={self.host} port={self.server_port}\n"  # every database of the server
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.directory / 'users.txt'}\n"
            f"pool_mode = transaction\ndefault_pool_size = {self.pool_size}\n"
            "max_client_conn = 2000\n"
            # fleetq's CLI connection sends `options` (its statement timeout): PgBouncer
            # forwards no such startup parameter, so it is ignored here
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.log}\npidfile = {self.directory / 'pgbouncer.pid'}\n"
        )

    def start(self) -> None:
        argv = [BINARY, *self.user_flag, str(self.directory / "pgbouncer.ini")]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_until(self._listening, what="PgBouncer to listen", deadline_s=30)

    def _listening(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"PgBouncer exited: {self._tail()}")
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def logins_since_start(self) -> int:
        """Clients that logged in to this process (its log since the last start)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text.rpartition("process up:")[2].count("login attempt")

    def stop(self) -> None:
        """SIGTERM: PgBouncer's immediate shutdown, every connection cut."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
