"""The run journal: folded into open launches, robust to a torn last line."""

from __future__ import annotations

import os
from pathlib import Path

from fleetq.runner.journal import Entry, Journal


def test_launches_fold_into_open_entries(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    journal.launching(1, 1, "run-a", "/srv/trees/1-1")
    journal.launched(1, 1, 4242, 1700000000.5, "boot:123")
    journal.launching(2, 3, "run-b")
    journal.launching(3, 1, "run-c")
    journal.ended(3, 1)
    assert journal.open_entries() == {
        (1, 1): Entry(1, 1, "run-a", 4242, 1700000000.5, "/srv/trees/1-1", "boot:123"),
        (2, 3): Entry(2, 3, "run-b"),
    }


def test_a_torn_last_line_is_ignored_and_compaction_keeps_what_is_open(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.launching(1, 1, "run-a")
    journal.launching(2, 1, "run-b")
    journal.ended(2, 1)
    with open(path, "a") as f:
        f.write('{"op": "launch", "job_id": 9, "tok')  # the runner died mid-write
    assert set(journal.open_entries()) == {(1, 1)}
    journal.compact()
    assert len(path.read_text().splitlines()) == 1
    assert Journal(path).open_entries() == journal.open_entries()


def test_a_launch_journaled_before_births_reads_without_one(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text(
        '{"op": "launch", "job_id": 1, "token": 2, "run_id": "run-a", "tree": null}\n'
        '{"op": "pid", "job_id": 1, "token": 2, "pid": 4242, "started_at": 1700000000.5}\n'
    )
    journal = Journal(path)
    assert journal.open_entries() == {(1, 2): Entry(1, 2, "run-a", 4242, 1700000000.5)}
    journal.compact()
    assert Journal(path).open_entries() == journal.open_entries()


def test_a_missing_journal_is_empty(tmp_path: Path) -> None:
    assert Journal(tmp_path / "none" / "journal.jsonl").open_entries() == {}


def test_the_journal_is_the_runner_s_alone(tmp_path: Path) -> None:
    """It was 0644 in a 0755 directory: jobs read what the runner launched (issue 41)."""
    old = os.umask(0o022)
    try:
        path = tmp_path / "runner" / "journal.jsonl"
        journal = Journal(path)
        journal.launching(1, 1, "run-a")
        assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)
        journal.compact()
        assert path.stat().st_mode & 0o777 == 0o600
        path.chmod(0o644)  # as an older runner left it
        Journal(path)
        assert path.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)
