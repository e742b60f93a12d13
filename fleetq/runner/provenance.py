"""What a verdict rests on besides the commit: the runner and its machine, the tool
versions and lockfiles its operation declares, the operation's definition as run, how its
commit was staged (issue 47).

Why: a commit that "failed" because the runner had another Python reads exactly like a
red test unless the verdict says which Python. The environment and the definition are
the same for thousands of verdicts; the database keeps each once, by its hash
(fleetq.provenance_kept), so sending them whole with every outcome costs bytes, not rows.

Tool versions are asked once per runner start and again when the tool's program file
changes (its path, size, mtime or inode), never per job: a tool asked per job would cost
a process per verdict. They run as the runner, with the jobs' allow-listed environment.
Files of the checkout (lockfiles here, reports in `testreports`) are read only when they
resolve inside the checkout and are not symlinks: a job's tree could point anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import platform
import shlex
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ConfigDict

from fleetq import __version__
from fleetq.core.configschema import EvidenceConfig

TOOL_TIMEOUT_S = 10.0
TOOL_ANSWER_CHARS = 200
MAX_LOCKFILE_BYTES = 256 * 1024 * 1024


class Evidence(EvidenceConfig):
    """An operation's declared evidence as runners read it back (a newer schema's extra
    keys are ignored, not refused: the runner may be older than the database)."""

    model_config = ConfigDict(frozen=True, extra="ignore")


def machine() -> dict[str, str]:
    """The runner's machine: what does not change while it runs."""
    return {
        "fleetq": __version__,
        "os": _os_name(),
        "kernel": f"{platform.system()} {platform.release()}",
        "arch": platform.machine(),
        "python": platform.python_version(),
    }


def _os_name() -> str:
    with contextlib.suppress(OSError):
        return platform.freedesktop_os_release().get("PRETTY_NAME", platform.platform())
    return platform.platform()


class Tools:
    """Tool versions by command, asked again only when the program's file changed."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[tuple[object, ...], str]] = {}

    async def versions(self, commands: Iterable[str], env: dict[str, str]) -> dict[str, str]:
        """Each command's answer (its first line of output), or why there is none."""
        found: dict[str, str] = {}
        for command in commands:
            argv = shlex.split(command)
            program = shutil.which(argv[0], path=env.get("PATH"))
            mark = _fingerprint(program)
            known = self._known.get(command)
            if known is not None and known[0] == mark:
                found[command] = known[1]
                continue
            answer = "not found" if program is None else await _ask(program, argv[1:], env)
            self._known[command] = (mark, answer)
            found[command] = answer
        return found


def _fingerprint(program: str | None) -> tuple[object, ...]:
    if program is None:
        return (None,)
    try:
        st = os.stat(program)
    except OSError:
        return (program, None)
    return (program, st.st_ino, st.st_size, st.st_mtime_ns)


async def _ask(program: str, args: list[str], env: dict[str, str]) -> str:
    try:
        proc = await asyncio.create_subprocess_exec(
            program,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,  # `python2 --version` answers on stderr
            env=env,
            start_new_session=True,
        )
    except OSError as exc:
        return f"cannot run: {exc.strerror}"
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), TOOL_TIMEOUT_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return f"no answer in {TOOL_TIMEOUT_S:g} s"
    lines = [line.strip() for line in out.decode(errors="replace").splitlines() if line.strip()]
    first = (lines or [""])[0][:TOOL_ANSWER_CHARS]
    return first if proc.returncode == 0 else f"exit {proc.returncode}: {first}"


def inside(tree: Path, relative: str) -> Path | None:
    """`relative` as a regular file of `tree` that no symlink leads out of, else None."""
    root = tree.resolve()
    path = tree / relative
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if not resolved.is_relative_to(root) or path.is_symlink() or not resolved.is_file():
        return None
    return resolved


def read_inside(path: Path, limit: int) -> bytes | None:
    """A file found by `inside`, read without following a symlink put there since (a job
    may still be running), and only up to `limit` bytes (None: larger, or gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    return None if len(data) > limit else data


def lockfiles(tree: Path, names: Iterable[str]) -> dict[str, str]:
    """Each declared lockfile's sha256 at the commit, or "absent"."""
    found: dict[str, str] = {}
    for name in names:
        path = inside(tree, name)
        data = None if path is None else read_inside(path, MAX_LOCKFILE_BYTES)
        found[name] = "absent" if data is None else "sha256:" + hashlib.sha256(data).hexdigest()
    return found


def definition(
    *,
    command: str | None,
    handler: str | None,
    timeout_s: int,
    limits: dict[str, Any],
    evidence: Evidence,
) -> dict[str, Any]:
    """The operation as this runner ran it."""
    found: dict[str, Any] = {"timeout_s": timeout_s}
    if command is not None:
        found["command"] = command
    if handler is not None:
        found["handler"] = handler
    if limits:
        found["limits"] = limits
    found.update(evidence.as_row())
    return found
