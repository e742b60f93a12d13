"""Handing a staged tree to a job's uid never follows a path a job can change (issue
41, finding 1). Run as root, as CI is: only root can give files away and run processes
as another uid."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetq.runner import handover

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root can give files away")

JOB_UID = 61900  # no user has it; these tests only
FILES = [f"f{i}" for i in range(5)]


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory the job uid may pass through (tmp_path's parents are 0700)."""
    top = Path(tempfile.mkdtemp(prefix="fleetq-handover-"))
    top.chmod(0o711)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def _fill(directory: Path) -> None:
    """Files and a subdirectory of files, all root's, named alike wherever they are
    (so a walk that strays from one copy into another finds every name)."""
    (directory / "sub").mkdir(parents=True)
    for name in FILES:
        (directory / name).write_text("x")
        (directory / "sub" / name).write_text("x")


def _owners(top: Path) -> dict[str, int]:
    """Every entry below `top` (not following symlinks) with its owner."""
    found = {}
    for root, dirs, files in os.walk(top):
        for name in (*dirs, *files):
            path = Path(root, name)
            found[str(path.relative_to(top))] = path.lstat().st_uid
    return found


def _as_job(command: str, cwd: Path) -> None:
    subprocess.run(
        ["/bin/sh", "-c", command], cwd=cwd, user=JOB_UID, group=JOB_UID, extra_groups=[],
        check=True, capture_output=True, timeout=10,
    )  # fmt: skip


def test_a_directory_swapped_for_a_symlink_mid_walk_gives_nothing_outside_away(
    reachable: Path, tmp_path: Path
) -> None:
    """The attack: while the walk is inside `d`, a process of the job's uid renames `d`
    and puts a symlink to a root-owned directory in its place. A walk by path went on
    through the symlink and handed the victim's files over."""
    victim = tmp_path / "victim"  # root's, outside the tree
    _fill(victim)
    tree = reachable / "tree"
    _fill(tree / "d")
    # the top already the job uid's, as a shared job user's was midway through a walk
    # (the uid's other job could rename in it): the swap must be possible
    os.chown(tree, JOB_UID, JOB_UID)
    swapped: list[str] = []

    def entering(relative: str) -> None:
        if relative == "d":
            _as_job(f"mv d d.moved && ln -s {victim} d", tree)
            swapped.append(relative)

    handover.hand_over(tree, JOB_UID, JOB_UID, entering=entering)
    assert swapped == ["d"] and (tree / "d").is_symlink()  # the race did happen
    assert _owners(victim) == dict.fromkeys(_owners(victim), 0), "root's files given away"
    # the walk went on in the directory it had entered, wherever it moved to
    moved = _owners(tree / "d.moved")
    assert moved == dict.fromkeys(moved, JOB_UID) and len(moved) == 2 * len(FILES) + 1


def test_hard_links_symlinks_and_others_files_keep_their_owner(
    reachable: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "shadow"
    outside.write_text("secret")
    tree = reachable / "tree"
    _fill(tree)
    os.link(outside, tree / "linked")  # a second name of a root-owned file
    (tree / "pointer").symlink_to(outside)
    handover.hand_over(tree, JOB_UID, JOB_UID)
    assert outside.stat().st_uid == 0 and outside.stat().st_nlink == 2
    assert (tree / "pointer").lstat().st_uid == 0  # the symlink itself is not needed
    assert {p: u for p, u in _owners(tree).items() if u != JOB_UID} == {
        "linked": 0,
        "pointer": 0,
    }
    st = tree.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (JOB_UID, JOB_UID, 0o700)


def test_a_symlink_at_the_top_is_refused(reachable: Path, tmp_path: Path) -> None:
    (reachable / "tree").symlink_to(tmp_path)
    with pytest.raises(OSError, match=r"Not a directory|symbolic links"):
        handover.hand_over(reachable / "tree", JOB_UID, JOB_UID)
    assert tmp_path.stat().st_uid == 0


def test_a_kept_tree_is_taken_back_and_closed(reachable: Path) -> None:
    tree = reachable / "tree"
    _fill(tree)
    handover.hand_over(tree, JOB_UID, JOB_UID)
    handover.take_back(tree)
    st = tree.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)
    with pytest.raises(subprocess.CalledProcessError):
        _as_job("cat tree/f0", reachable)  # the next job of this uid cannot enter it
