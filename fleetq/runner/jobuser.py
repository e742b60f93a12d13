"""Command jobs under another uid (`--job-user`), so a job cannot read the runner's
secrets: a job ran as the runner's uid and read `FLEETQ_DSN=postgresql://…:<password>@…`
from `/proc/$PPID/environ`; a root runner ran jobs as root.

The runner also makes itself non-dumpable (`PR_SET_DUMPABLE 0`, see `orphans`), so a
job that does share its uid cannot read its `/proc` files either. Handler jobs run
inside the runner's process and keep its privileges: run untrusted code as commands.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fleetq.core.errors import ConfigError


@dataclass(frozen=True)
class JobUser:
    """Who command jobs run as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @classmethod
    def named(cls, name: str) -> JobUser:
        """The user `name`; a ConfigError when there is none or this process cannot
        switch to it (only root can run processes as another user)."""
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise ConfigError(f"--job-user {name}: no such user on this node") from None
        if os.geteuid() not in (0, entry.pw_uid):
            raise ConfigError(
                f"--job-user {name}: only a runner started as root can run jobs as another user"
            )
        groups = tuple(os.getgrouplist(name, entry.pw_gid))
        return cls(name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)

    def environment(self) -> dict[str, str]:
        """The job's HOME, USER and LOGNAME."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}

    def process_options(self) -> dict[str, object]:
        """What `asyncio.create_subprocess_exec` takes to start a process as this user."""
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def prepare(self, trees: Path) -> None:
        """Make `trees` (where staged checkouts go) reachable by this user: the runner's
        own directories up to it become traversable (0711: enter, not list), then a
        process of this user must be able to enter it, or a ConfigError names the
        directory that stops it (a work dir under a private home, say)."""
        trees.mkdir(parents=True, exist_ok=True)
        for directory in (trees.parent, trees):
            directory.chmod(directory.stat().st_mode | 0o711)
        probe = subprocess.run(
            ["/bin/sh", "-c", 'cd "$1"', "probe", str(trees)],
            user=self.uid,
            group=self.gid,
            extra_groups=list(self.groups),
            capture_output=True,
            check=False,
            timeout=10,
        )
        if probe.returncode != 0:
            blocker = _first_unreachable(trees, self.uid, self.gid)
            raise ConfigError(
                f"--job-user {self.name} cannot enter {trees} ({blocker} is closed to it); "
                "choose a --work-dir it can reach"
            )

    def give(self, tree: Path) -> None:
        """Hand a freshly staged tree to this user (it builds in it)."""
        os.lchown(tree, self.uid, self.gid)
        for root, dirs, files in os.walk(tree):
            for entry in (*dirs, *files):
                os.lchown(os.path.join(root, entry), self.uid, self.gid)


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
