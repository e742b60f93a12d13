"""Staging: the exact commit, a populated index, a fetch only when the commit is missing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleetq.runner.staging import CommitMissing, Staging, StagingFailed, git_reason


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    repo = tmp_path / "origin"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    (repo / "a.txt").write_text("one\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    return repo


async def test_stages_an_older_commit_with_a_clean_index(origin: Path, tmp_path: Path) -> None:
    old = _git(origin, "rev-parse", "HEAD")
    (origin / "a.txt").write_text("two\n")
    _git(origin, "commit", "-qam", "two")
    tree = await Staging(tmp_path / "work").stage(repository=str(origin), commit=old, name="t1")
    assert _git(tree, "rev-parse", "HEAD") == old
    assert _git(tree, "status", "--porcelain") == ""
    assert (tree / "a.txt").read_text() == "one\n"


async def test_fetches_only_when_the_commit_is_missing(origin: Path, tmp_path: Path) -> None:
    staging = Staging(tmp_path / "work")
    first = _git(origin, "rev-parse", "HEAD")
    await staging.stage(repository=str(origin), commit=first, name="t1")
    (origin / "a.txt").write_text("new\n")
    _git(origin, "commit", "-qam", "later")
    later = _git(origin, "rev-parse", "HEAD")
    (mirror,) = staging.mirrors.glob("*.git")
    fetch_head = mirror / "FETCH_HEAD"
    await staging.stage(repository=str(origin), commit=first, name="t2")
    assert not fetch_head.exists()  # the commit was there: no fetch
    tree = await staging.stage(repository=str(origin), commit=later, name="t3")
    assert fetch_head.exists() and _git(tree, "rev-parse", "HEAD") == later


async def test_an_unknown_commit_is_missing_and_an_unknown_repository_fails(
    origin: Path, tmp_path: Path
) -> None:
    staging = Staging(tmp_path / "work")
    with pytest.raises(CommitMissing, match="is not in"):
        await staging.stage(repository=str(origin), commit="c" * 40, name="t1")
    with pytest.raises(StagingFailed, match=r"cannot clone .*: fatal: .* does not exist"):
        await staging.stage(repository=str(tmp_path / "nowhere"), commit="c" * 40, name="t2")


async def test_mirrors_are_private_and_isolated_trees_stand_alone(
    origin: Path, tmp_path: Path
) -> None:
    """Jobs under other uids read other projects' mirrors (issue 41): mirrors are 0700,
    and a tree for such a job has its own objects (no alternates into the mirror)."""
    head = _git(origin, "rev-parse", "HEAD")
    (tmp_path / "work" / "mirrors").mkdir(parents=True, mode=0o755)  # an older runner's
    staging = Staging(tmp_path / "work", isolated=True)
    tree = await staging.stage(repository=str(origin), commit=head, name="t1")
    assert staging.mirrors.stat().st_mode & 0o777 == 0o700
    assert not (tree / ".git" / "objects" / "info" / "alternates").exists()
    assert _git(tree, "rev-parse", "HEAD") == head and _git(tree, "status", "--porcelain") == ""
    shared = await Staging(tmp_path / "work").stage(repository=str(origin), commit=head, name="t2")
    assert (shared / ".git" / "objects" / "info" / "alternates").exists()  # the fast default
    staging.discard(tree)
    assert not tree.exists()


def test_a_failure_says_what_git_said_went_wrong() -> None:
    """A missing repository's refusal quoted git's last line, its advice: "...: and the
    repository exists." (issue 42, finding 10)."""
    said = (
        "fatal: '/nowhere' does not appear to be a git repository\n"
        "fatal: Could not read from remote repository.\n\n"
        "Please make sure you have the correct access rights\nand the repository exists.\n"
    )
    assert git_reason(said) == "fatal: '/nowhere' does not appear to be a git repository"
    assert git_reason("something odd\nlast words\n") == "last words"
    assert git_reason("") == ""
