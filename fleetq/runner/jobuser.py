"""Command jobs under uids of their own (`--job-uid-range`, `--job-user`), so a job can
read neither the runner's secrets nor another job's tree, log or project.

Why: a job that ran as the runner's uid read `FLEETQ_DSN=postgresql://…:<password>@…`
from `/proc/$PPID/environ`, and a root runner ran jobs as root (issue 13); jobs that
shared one job user wrote into each other's checkouts and, racing the hand-over of a
staged tree, were given root's files (issue 41). Now each running command job holds a
uid of a configured range alone: leased when its job is claimed, returned when it ends,
after everything still running under it is killed (so nothing a job leaves behind waits
for the next job of that uid). A uid whose processes survive SIGKILL is not returned.

The runner also makes itself non-dumpable (`PR_SET_DUMPABLE 0`, see `orphans`), so a
job that does share its uid cannot read its `/proc` files either. Handler jobs run
inside the runner's process and keep its privileges: run untrusted code as commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import pwd
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from fleetq.core.errors import ConfigError

log = logging.getLogger(__name__)

# how long the kill of what a job left under its uid may take before the uid is withheld
SWEEP_DEADLINE_S = 10.0


@dataclass(frozen=True)
class JobUser:
    """One uid command jobs run as, with its group and supplementary groups."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def of_uid(cls, uid: int, option: str) -> JobUser:
        """Uid `uid`: its user's name and groups when it has one, else a group of its
        own number (refused when that gid is another group's: the job would be in it)."""
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            try:
                taken = grp.getgrgid(uid).gr_name
            except KeyError:
                return cls(f"fleetq-job-{uid}", uid, uid, ())
            raise ConfigError(
                f"{option}: uid {uid} has no user and gid {uid} is group {taken}'s; choose "
                "ids no user or group has, or give each uid a user"
            ) from None
        groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
        return cls(entry.pw_name, uid, entry.pw_gid, groups)

    def environment(self, home: Path) -> dict[str, str]:
        """The job's HOME and TMPDIR (a fresh private directory per run, so nothing
        carries over from one job to the next), USER and LOGNAME."""
        return {"HOME": str(home), "TMPDIR": str(home), "USER": self.name, "LOGNAME": self.name}

    def process_options(self) -> dict[str, object]:
        """What `asyncio.create_subprocess_exec` takes to start a process as this user
        (`extra_groups` always: an empty list drops the runner's own groups)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}


class JobUsers:
    """The uids of a runner's command jobs, each leased to one running job at a time."""

    def __init__(self, users: list[JobUser], option: str) -> None:
        self.users = users
        self.option = option
        self._free: asyncio.Queue[JobUser] = asyncio.Queue()
        for user in users:
            self._free.put_nowait(user)

    @classmethod
    def configured(cls, job_user: str | None, uid_range: range | None) -> JobUsers | None:
        """From `--job-user USER` (a range of one) or `--job-uid-range FIRST-LAST`;
        None when neither is given. A ConfigError for a uid this process cannot switch
        to, or that would share the runner's own privileges."""
        if job_user is not None:
            option = f"--job-user {job_user}"
            try:
                uids: range | list[int] = [pwd.getpwnam(job_user).pw_uid]
            except KeyError:
                raise ConfigError(f"{option}: no such user on this node") from None
        elif uid_range is not None:
            option = f"--job-uid-range {uid_range.start}-{uid_range.stop - 1}"
            uids = uid_range
        else:
            return None
        _check_switchable(option, uids)
        return cls([JobUser.of_uid(uid, option) for uid in uids], option)

    def prepare(self, trees: Path) -> None:
        """Make `trees` (where staged checkouts go) reachable by job users: the runner's
        own directories up to it become traversable (0711: enter, not list; the
        runner's directory and `trees` exactly that), then a
        process of each kind of job user must be able to enter it, or a ConfigError
        names the directory that stops it (a work dir under a private home, say)."""
        trees.mkdir(parents=True, exist_ok=True)
        for directory in (trees.parent, trees):
            directory.chmod(0o711)
        kinds = {(u.gid, u.groups): u for u in self.users}
        for user in kinds.values():
            _probe(user, trees, self.option)

    async def lease(self, stop: asyncio.Event) -> JobUser | None:
        """A uid no running job holds; waits while all are held (a superseded run of
        this runner still stopping), None if `stop` is set first."""
        if not self._free.empty():
            return self._free.get_nowait()
        getting = asyncio.ensure_future(self._free.get())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({getting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if getting.done():
            return getting.result()
        getting.cancel()
        return None

    async def give_back(self, user: JobUser) -> None:
        """Return `user`'s uid after its job: whatever still runs under it is killed
        first. A uid with a survivor (stuck in the kernel) is withheld, said once."""
        survivors = await asyncio.to_thread(kill_processes_of, user.uid, SWEEP_DEADLINE_S)
        if survivors:
            log.error(
                "uid %d (%s) withheld from jobs: processes %s survived SIGKILL",
                user.uid,
                self.option,
                survivors,
            )
            return
        self._free.put_nowait(user)


def kill_processes_of(uid: int, deadline_s: float) -> list[int]:
    """SIGKILL every live process running as `uid` (real, effective or saved) and wait,
    up to `deadline_s`, until none is left; returns the pids still alive then. Those
    that were orphaned to this runner (the subreaper) are reaped: a zombie keeps its pid
    and answers `kill -0`, for the next job of the uid too."""
    end = time.monotonic() + deadline_s
    while True:
        alive, dead = _processes_of(uid)
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for pid in dead:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)  # only our own (orphaned) children
        if not alive or time.monotonic() >= end:
            return alive
        # no event says "a uid has no process left": poll the process table
        time.sleep(0.02)


def _processes_of(uid: int) -> tuple[list[int], list[int]]:
    """The live processes of `uid`, and its zombies."""
    alive: list[int] = []
    dead: list[int] = []
    for proc in psutil.process_iter(["pid", "uids", "status"]):
        uids = proc.info["uids"]
        if uids is not None and uid in uids:
            zombie = proc.info["status"] == psutil.STATUS_ZOMBIE
            (dead if zombie else alive).append(proc.info["pid"])
    return alive, dead


def _check_switchable(option: str, uids: range | list[int]) -> None:
    """Only root can run processes as another user, and a job under uid 0 or the
    runner's own would read what the runner reads."""
    euid = os.geteuid()
    if euid in uids or 0 in uids:
        raise ConfigError(
            f"{option}: holds uid {euid if euid in uids else 0}, the runner's own or root's; "
            "jobs under it could read the runner's credentials"
        )
    if euid != 0:
        raise ConfigError(f"{option}: only a runner started as root can run jobs as other uids")


def _probe(user: JobUser, trees: Path, option: str) -> None:
    """Can `user` enter `trees`? A ConfigError naming the directory in its way if not."""
    probe = subprocess.run(
        ["/bin/sh", "-c", 'cd "$1"', "probe", str(trees)],
        capture_output=True,
        check=False,
        timeout=10,
        user=user.uid,
        group=user.gid,
        extra_groups=list(user.groups),
    )
    if probe.returncode != 0:
        blocker = _first_unreachable(trees, user.uid, user.gid)
        raise ConfigError(
            f"{option} cannot enter {trees} ({blocker} is closed to uid {user.uid}); "
            "choose a --work-dir it can reach"
        )


def _first_unreachable(path: Path, uid: int, gid: int) -> Path:
    """The first directory from / down to `path` that `uid` may not enter."""
    for directory in [*reversed(path.parents), path]:
        st = directory.stat()
        if st.st_uid == uid:
            allowed = bool(st.st_mode & 0o100)
        elif st.st_gid == gid:
            allowed = bool(st.st_mode & 0o010)
        else:
            allowed = bool(st.st_mode & 0o001)
        if not allowed:
            return directory
    return path


def warn_shared_uid() -> None:
    """Without job users, command jobs run as the runner's own uid: say what that lets
    them read (root: everything)."""
    who = "root" if os.geteuid() == 0 else f"this runner's own uid ({os.geteuid()})"
    log.warning(
        "command jobs run as %s and can read what the runner reads, its credentials "
        "included (a passfile named in its DSN, or its API token file); to keep them out, "
        "run it as root with --job-uid-range",
        who,
    )
