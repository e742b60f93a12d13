"""Giving a staged tree to the uid its job runs as, without following a path a job can
change (issue 41).

The runner (root) stages a tree, then makes it the job's. It used to walk the tree by
path and `lchown` each entry: a job of another run, under the same uid, renamed a
directory of the tree being walked and put a symlink to a root-owned directory in its
place, and the walk went on down the symlink, handing /usr-like trees to the job user.

Here every step goes through file descriptors: a directory is opened relative to its
parent's descriptor with O_NOFOLLOW, read through its own descriptor, and each entry is
changed through a descriptor of exactly the inode that was checked. A directory renamed
away meanwhile is still the one walked (its descriptor follows it); a symlink is never
entered nor changed; a file with more than one link (a hard link to someone else's
file) and anything the runner does not own keep their owner. The tree's top is handed
over last, so nothing below it is writable by the job user until all of it is done.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

# open a directory met on the walk: never through a symlink, never blocking
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
# refer to an entry without opening it (no side effect on a FIFO or a device)
_ENTRY = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC

Entering = Callable[[str], None]


def hand_over(
    top: Path, uid: int, gid: int, *, mode: int = 0o700, entering: Entering | None = None
) -> None:
    """Make `top` and what the runner put in it belong to `uid`:`gid`, `top` with
    `mode` (0700: no other job may look in). `entering(relative path)` is called as each
    directory is entered, before its entries change (tests race the walk there)."""
    fd = os.open(top, _DIRECTORY)
    try:
        _hand_over_entries(fd, "", uid, gid, entering)
        os.fchmod(fd, mode)
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def take_back(top: Path) -> None:
    """Give `top` (a tree kept after its run) back to the runner, closed (0700): the
    next job of its uid cannot enter it. Only the top changes: nothing below is
    reachable without it."""
    fd = os.open(top, _DIRECTORY)
    try:
        os.fchown(fd, os.geteuid(), os.getegid())
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _hand_over_entries(
    dir_fd: int, relative: str, uid: int, gid: int, entering: Entering | None
) -> None:
    """Hand over what is in the directory `dir_fd`, depth first."""
    if entering is not None:
        entering(relative)
    for name in os.listdir(dir_fd):
        below = f"{relative}/{name}" if relative else name
        sub = _open_directory(dir_fd, name)
        if sub is not None:
            try:
                _hand_over_entries(sub, below, uid, gid, entering)
                if os.fstat(sub).st_uid == os.geteuid():
                    os.fchown(sub, uid, gid)
            finally:
                os.close(sub)
        else:
            _hand_over_file(dir_fd, name, uid, gid)


def _open_directory(dir_fd: int, name: str) -> int | None:
    """`name` in `dir_fd` opened as a directory; None when it is anything else now (a
    file, a symlink, gone)."""
    try:
        return os.open(name, _DIRECTORY, dir_fd=dir_fd)
    except (NotADirectoryError, FileNotFoundError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink, which is never followed
            return None
        raise


def _hand_over_file(dir_fd: int, name: str, uid: int, gid: int) -> None:
    """Hand over one non-directory entry, through a descriptor of the very inode that
    was checked: a regular file the runner owns with a single link. Symlinks keep
    their owner (the job owns the directory, so it may replace them)."""
    try:
        fd = os.open(name, _ENTRY, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == os.geteuid():
            # /proc/self/fd/N names the inode `fd` refers to, whatever its path is now
            with contextlib.suppress(FileNotFoundError):
                os.chown(f"/proc/self/fd/{fd}", uid, gid)
    finally:
        os.close(fd)
