"""What the embedded server needs of the machine: its system user, and whether the
processes and directories it finds are what they seem (a pid file's postgres, a TLS
front, the socket directory, the directories above home).

Why apart from `embedded`: these ask the operating system (`/proc`, the user database,
file owners and modes), not the server, and the server manager, its programs, its
certificate and its TLS front each ask them. PostgreSQL refuses to run as root, so as
root the server runs as `SERVER_USER`, created on first use.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pwd
import shutil
import stat
import subprocess
from pathlib import Path

from fleetq.core.errors import EmbeddedServerError

log = logging.getLogger("fleetq.core.embedded")  # the server's own log name

SERVER_USER = "fleetq-pg"
_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes; leave room for "/.s.PGSQL.NNNNN"


def is_front(pid: int, state_file: Path) -> bool:
    """Whether `pid` is a live TLS front of this home (its state file on its command
    line): a pid reused by another process, another home's front included, is not."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"fleetq.core.tlsfront" in argv and f"--state={state_file}".encode() in argv


def runs_as_server(programs: Path) -> str | None:
    """None when the server user can run the programs in `programs`; else what failed."""
    user = ensure_server_user().pw_name
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


def read_postmaster(pgdata: Path) -> tuple[int, int, Path, str] | None:
    """What `postmaster.pid` says (pid, port, socket dir, listen address), if its process
    is a live postgres.

    A pid file whose process is gone or is not postgres is stale and is removed.
    """
    pid_file = pgdata / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
    except (FileNotFoundError, PermissionError):
        return None
    if len(lines) < 8 or not lines[0].strip().isdigit():
        return None  # being written right now by a starting server
    pid = int(lines[0])
    if not is_postgres(pid):
        log.warning("removing stale %s (pid %d is not a running postgres)", pid_file, pid)
        with contextlib.suppress(FileNotFoundError):
            pid_file.unlink()
        return None
    if lines[7].strip() != "ready":
        return None
    return pid, int(lines[3]), Path(lines[4]), lines[5].strip()


def is_postgres(pid: int) -> bool:
    """Whether `pid` is a live postgres process (a pid file's pid may have been reused)."""
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


def give_to_server(path: Path) -> None:
    """Make `path` the server user's (as root, the server runs as that user)."""
    user = ensure_server_user()
    os.chown(path, user.pw_uid, user.pw_gid)


def ensure_server_user() -> pwd.struct_passwd:
    """The server user, created (a system user without home or shell) when missing."""
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


def check_traversable(home: Path) -> None:
    """Refuse a home the server user cannot reach: every directory above it must let
    others enter."""
    for parent in home.parents:
        if not parent.stat().st_mode & stat.S_IXOTH:
            raise EmbeddedServerError(
                f"the embedded server runs as {SERVER_USER!r}, which cannot enter {parent} "
                f"(mode {stat.filemode(parent.stat().st_mode)}); set FLEETQ_HOME to a "
                "directory outside it"
            )


def private_socket_dir(home: Path, port: int, *, as_root: bool) -> Path:
    """A private directory for the socket of the server in `home`, short enough for
    sun_path (the server user's when `as_root`).

    For a long home it is a predictable `/tmp/fleetq-<euid>-<hash>`, which anyone can
    create first: a foreign one (someone else's, or a symlink) is refused, since the
    socket's trust auth makes whoever controls the directory the server's gatekeeper.
    One of our own that is open to others is closed again."""
    preferred = home / "run"
    if len(f"{preferred}/.s.PGSQL.{port}") > _SOCKET_PATH_MAX:
        digest = hashlib.sha256(str(home).encode()).hexdigest()[:10]
        preferred = Path("/tmp") / f"fleetq-{os.geteuid()}-{digest}"  # noqa: S108
    with contextlib.suppress(FileExistsError):
        preferred.mkdir(mode=0o700)
    st = preferred.lstat()
    ours = {os.geteuid()} | ({ensure_server_user().pw_uid} if as_root else set())
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in ours:
        raise EmbeddedServerError(
            f"the socket directory {preferred} exists but is not this user's own "
            f"directory (owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}); "
            "someone else may have made it: remove it, or set a shorter FLEETQ_HOME"
        )
    if st.st_mode & 0o077:
        preferred.chmod(0o700)
    if as_root:
        give_to_server(preferred)
    return preferred
