"""What only the runner may read: its journal, its jobs' logs, its mirrors.

Why: jobs ran under a uid of their own yet read other jobs' logs (mode 0644) and the
runner's journal (issue 41). Whatever the umask, these are made 0600 (files) and 0700
(directories), and an existing one left open by an older runner is closed again.
"""

from __future__ import annotations

import os
from pathlib import Path

# a file of the runner's: created private, never through a symlink
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def private_directory(path: Path) -> Path:
    """`path`, made if missing, with mode 0700."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def open_private(path: Path, *, append: bool = False) -> int:
    """A descriptor to write `path` (truncated, or appended to), mode 0600."""
    fd = os.open(path, _FILE_FLAGS | (os.O_APPEND if append else os.O_TRUNC), 0o600)
    os.fchmod(fd, 0o600)
    return fd
