"""Prepare: put a job's exact commit in a fresh directory of its own.

Each project has a local mirror (cloned once, fetched only when a commit is missing).
Each execution gets `git clone --shared --no-checkout` of the mirror and a detached
checkout of the commit, so the tree is a real git checkout with a populated index:
`git status` is clean and `git rev-parse HEAD` is the commit, which the tools under test
expect (an exported tree without an index once failed checks for that reason).
Every git command that takes a commit gets `--end-of-options`.

Mirrors are the runner's alone (0700). When jobs run under uids of their own
(`isolated`), a job may read its own project's objects and nothing else: its tree is
cloned without `--shared` (an alternates file pointing into a mirror the job cannot
read), its objects hard-linked from the mirror (read-only, still the runner's), and the
runner hands the tree over (`handover`) before the job runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
from pathlib import Path

from fleetq.core.errors import FleetqError
from fleetq.runner.private import private_directory


class StagingFailed(FleetqError):
    """The commit could not be staged: an error of the fleet (a fetch or checkout
    failed), the job's outcome says so."""


class CommitMissing(StagingFailed):
    """The repository, fetched, has no such commit: the job asks for what does not
    exist, and is refused."""


class Staging:
    """Mirrors and per-execution trees below one runner directory."""

    def __init__(self, root: Path, *, isolated: bool = False) -> None:
        self.mirrors = root / "mirrors"
        self.trees = root / "trees"
        self.isolated = isolated
        self._locks: dict[str, asyncio.Lock] = {}

    async def stage(
        self, *, repository: str, commit: str, name: str, facts: dict[str, str] | None = None
    ) -> Path:
        """A fresh checkout of `commit` at trees/`name`; raises `StagingFailed`. `facts`,
        when given, is told how: the mirror `cloned`, `fetched` or `warm`, and the
        checkout's git tree hash (what its files are, whatever the commit says)."""
        mirror, how = await self._mirror_with(repository, commit)
        tree = self.trees / name
        shutil.rmtree(tree, ignore_errors=True)
        self.trees.mkdir(parents=True, exist_ok=True)
        share = "--local" if self.isolated else "--shared"
        await _git(None, "clone", "--quiet", share, "--no-checkout", str(mirror), str(tree))
        await _git(
            tree,
            "-c",
            "advice.detachedHead=false",
            "switch",
            "--quiet",
            "--detach",
            "--end-of-options",
            commit,
        )
        if facts is not None:
            facts["mirror"] = how
            # HEAD is ours, not input: no --end-of-options (rev-parse would print it)
            facts["tree"] = await _git_out(tree, "rev-parse", "--verify", "HEAD^{tree}")
        return tree

    def sweep(self, keep: set[Path]) -> list[Path]:
        """At start-up: remove the trees an earlier process left (a crash, a kill -9),
        except those of runs adopted meanwhile. Returns what was removed."""
        if not self.trees.is_dir():
            return []
        gone = [tree for tree in self.trees.iterdir() if tree not in keep]
        for tree in gone:
            shutil.rmtree(tree, ignore_errors=True)
        return gone

    def discard(self, tree: Path) -> None:
        """Remove a staged tree (after the outcome is recorded), and its job's home.
        (rmtree works through descriptors: a job's symlinks are removed, not followed.)"""
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(self.home_of(tree), ignore_errors=True)

    def home_of(self, tree: Path) -> Path:
        """Where the job of `tree` gets its HOME when it runs as a job user: beside the
        tree, so `sweep` and `discard` remove it with it."""
        return tree.with_name(tree.name + ".home")

    async def _mirror_with(self, repository: str, commit: str) -> tuple[Path, str]:
        """The project's mirror holding `commit`, and how: cloned now, fetched, or warm."""
        key = hashlib.sha256(repository.encode()).hexdigest()[:16]
        mirror = private_directory(self.mirrors) / f"{key}.git"  # closed even if made open
        how = "warm"
        async with self._locks.setdefault(key, asyncio.Lock()):
            if not (mirror / "HEAD").exists():
                how = "cloned"
                tmp = mirror.with_suffix(".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                await _git(
                    None,
                    "clone",
                    "--quiet",
                    "--mirror",
                    "--end-of-options",
                    repository,
                    str(tmp),
                    failure=f"cannot clone {repository}",
                )
                tmp.rename(mirror)
            if not await _has_commit(mirror, commit):
                how = "fetched"
                await _git(
                    mirror,
                    "fetch",
                    "--quiet",
                    "--prune",
                    "origin",
                    failure=f"cannot fetch {repository}",
                )
                if not await _has_commit(mirror, commit):
                    raise CommitMissing(f"commit {commit} is not in {repository}")
        return mirror, how


async def _has_commit(repo: Path, commit: str) -> bool:
    proc = await asyncio.create_subprocess_exec(
        "git",
        "-C",
        str(repo),
        "cat-file",
        "-e",
        "--end-of-options",
        f"{commit}^{{commit}}",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    return await proc.wait() == 0


async def _git(repo: Path | None, *args: str, failure: str | None = None) -> str:
    """Run git; its output (stdout and stderr), or `StagingFailed` with its reason."""
    argv = ["git", *(["-C", str(repo)] if repo else []), *args]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "GIT_TERMINAL_PROMPT": "0"},
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        detail = git_reason(out.decode(errors="replace"))
        raise StagingFailed(f"{failure or 'git ' + args[0] + ' failed'}: {detail}")
    return out.decode(errors="replace")


async def _git_out(repo: Path, *args: str) -> str:
    """A git command's one line of answer."""
    return (await _git(repo, *args)).strip()


def git_reason(output: str) -> str:
    """What git said went wrong: its first `fatal:`/`error:` line (the last line was
    often only advice: "...and the repository exists."), else its last line."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    said = [line for line in lines if line.startswith(("fatal:", "error:"))]
    return (said or lines[-1:] or [""])[0]
