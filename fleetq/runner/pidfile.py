"""One process per runner directory: `runner.pid`, locked for the process's whole life.

Why: the runner id's lock (`identity`) lives on a database session, and a session can end
while its process lives on (a SIGSTOP past the server's keepalives, an operator's
pg_terminate_backend). A second process of the same runner then took the id, swept the
first one's healthy run and reported it lost; twice, and the job failed `lost`. The
runner's directory is on the machine, where a live process can be told from a dead one:
the file is held with `flock`, which the kernel lets go only when the process is gone
(kill -9 included; a stopped process keeps it), so a held lock is a live predecessor and
the newcomer is refused (`RunnerIdInUse`) before it touches the database.

The file also says who held it (pid, birth, runner id). Read when the lock is taken, it
is evidence that the process before this one *in this directory* is dead: the
collection pass settles that process's leases at once (see `collection`). Without it (a
fresh directory, a runner of this id elsewhere) nothing proves the holder of the id's
leases dead, and they are left to run out. Not removed at exit: unlinking a locked file
races a newcomer's open, and the contents stay true ("the last process here").
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

from fleetq.runner import orphans
from fleetq.runner.identity import RunnerIdInUse

FILE = "runner.pid"


@dataclass(frozen=True)
class Holder:
    """A process that held (or holds) a runner directory."""

    pid: int
    birth: str | None
    runner: str


class DirectoryLock:
    """This process's hold on its runner directory, and who held it before."""

    def __init__(self, fd: int, path: Path, predecessor: Holder | None) -> None:
        self._fd: int | None = fd
        self.path = path
        # the process that last held this directory (gone: its lock was free); None when
        # the file named nobody (first start here, or a runner from before this file)
        self.predecessor = predecessor

    def release(self) -> None:
        """Let the directory go (a clean exit; the kernel does it at any other)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def take(directory: Path, runner: str) -> DirectoryLock:
    """Hold `directory` for this process, or raise `RunnerIdInUse` naming the live
    process that holds it."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / FILE
    # not truncated before the lock is ours: the holder's contents name it
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        raise RunnerIdInUse(_refusal(runner, directory, holder)) from None
    except BaseException:
        os.close(fd)
        raise
    try:
        os.fchmod(fd, 0o600)
        before = _read(fd)
        me = Holder(pid=os.getpid(), birth=orphans.birth(os.getpid()), runner=runner)
        _write(fd, me)
    except BaseException:
        os.close(fd)
        raise
    predecessor = before if before is not None and before.runner == runner else None
    return DirectoryLock(fd, path, predecessor)


def _read(fd: int) -> Holder | None:
    """Who the file names; None if it names nobody readable (empty, torn, foreign)."""
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"null")
        return Holder(pid=int(data["pid"]), birth=data.get("birth"), runner=str(data["runner"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _write(fd: int, me: Holder) -> None:
    data = json.dumps({"pid": me.pid, "birth": me.birth, "runner": me.runner}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data + b"\n", 0)
    os.fsync(fd)


def _refusal(runner: str, directory: Path, holder: Holder | None) -> str:
    who = "another process" if holder is None else f"another process (pid {holder.pid}"
    if holder is not None:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(holder.pid).status() == psutil.STATUS_STOPPED:
                who += ", stopped: SIGCONT or kill it"
        who += ")"
    return (
        f"runner {runner} is already served by {who}, which holds {directory / FILE}; stop "
        "that process first, or give this one another --name"
    )
