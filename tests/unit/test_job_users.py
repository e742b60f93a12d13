"""Job users: a uid per running command job, leased and returned, nothing of a job left
under its uid for the next; the range checked at start (issue 41, finding 12)."""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetq.core.errors import ConfigError
from fleetq.runner.config import RunnerConfig, load
from fleetq.runner.jobuser import JobUser, JobUsers, kill_processes_of
from fleetq.runner.main import build_parser

FIRST = 61901  # 61901-61902: no user has them; these tests only
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root can run jobs as other uids")


def _config(lanes: dict[str, int], **options: object) -> RunnerConfig:
    return load({"node": "n", "lanes": lanes, **options}, None)


def test_a_range_smaller_than_the_slots_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"holds 2 uid\(s\) for 3 slot\(s\) \(checks=2, "):
        _config({"checks": 2, "control": 1}, job_uid_range="61000-61001")
    with pytest.raises(ConfigError, match=r"job_user nobody is one uid for 2 slot\(s\)"):
        _config({"checks": 2}, job_user="nobody")
    with pytest.raises(ConfigError, match="is empty"):
        _config({"checks": 1}, job_uid_range="61001-61000")
    with pytest.raises(ConfigError, match="not both"):
        _config({"checks": 1}, job_uid_range="61000-61003", job_user="nobody")
    config = _config({"checks": 2, "control": 1}, job_uid_range="61000-61002")
    assert config.job_uids == range(61000, 61003)


def test_help_says_what_jobs_without_job_users_can_read() -> None:
    text = " ".join(build_parser().format_help().split())
    assert "--job-uid-range FIRST-LAST" in text and "a --job-uid-range of one" in text
    assert "can read what it reads, its credentials included" in text


@as_root
def test_the_range_may_hold_neither_root_nor_the_runner() -> None:
    with pytest.raises(ConfigError, match="holds uid 0"):
        JobUsers.configured(None, range(0, 4))
    with pytest.raises(ConfigError, match="no such user"):
        JobUsers.configured("no-such-user-here", None)


def test_a_uid_without_a_user_gets_a_group_of_its_number_unless_it_is_taken() -> None:
    assert JobUser.of_uid(FIRST, "o") == JobUser(f"fleetq-job-{FIRST}", FIRST, FIRST, ())
    users = {u.pw_uid for u in pwd.getpwall()}
    taken = next(g for g in grp.getgrall() if g.gr_gid not in users and g.gr_gid > 0)
    with pytest.raises(ConfigError, match=f"gid {taken.gr_gid} is group {taken.gr_name}'s"):
        JobUser.of_uid(taken.gr_gid, "o")


@pytest.fixture
def pool() -> Iterator[JobUsers]:
    users = JobUsers([JobUser.of_uid(uid, "o") for uid in (FIRST, FIRST + 1)], "o")
    yield users
    for uid in (FIRST, FIRST + 1):
        kill_processes_of(uid, 10)


async def test_a_uid_is_leased_to_one_job_at_a_time(pool: JobUsers) -> None:
    never = asyncio.Event()
    first, second = await pool.lease(never), await pool.lease(never)
    assert first is not None and second is not None and first.uid != second.uid
    third = asyncio.ensure_future(pool.lease(never))
    await asyncio.sleep(0)  # let it wait: both uids are held
    assert not third.done()
    await pool.give_back(first)
    assert await asyncio.wait_for(third, 10) == first
    stop = asyncio.Event()
    waiting = asyncio.ensure_future(pool.lease(stop))
    stop.set()
    assert await asyncio.wait_for(waiting, 10) is None  # stopped while waiting for a uid


def _escaped(uid: int) -> subprocess.Popen[bytes]:
    """A process of `uid` in a session of its own (escaped its job's group), running."""
    proc = subprocess.Popen(
        ["sleep", "600"], user=uid, group=uid, extra_groups=[], start_new_session=True
    )
    end = time.monotonic() + 10
    while not _of_uid(uid) and time.monotonic() < end:
        time.sleep(0.01)
    return proc


def _of_uid(uid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            uids = next(line for line in status.splitlines() if line.startswith("Uid:"))
            if str(uid) in uids.split()[1:]:  # zombies too: they hold their pids
                found.append(int(entry.name))
    return found


@as_root
async def test_a_uid_is_returned_only_once_nothing_of_its_job_runs(pool: JobUsers) -> None:
    user = await pool.lease(asyncio.Event())
    assert user is not None
    leftover = _escaped(user.uid)
    assert _of_uid(user.uid) == [leftover.pid]
    await pool.give_back(user)
    assert _of_uid(user.uid) == []  # killed and reaped (this test is its parent)
    leftover.wait(timeout=10)
    assert await pool.lease(asyncio.Event()) is not None
