"""Schedules fired by the reaper's leader: one job per tick whoever leads (two leaders
at once included), the catch-up rules, pausing with a reason, a branch resolved at fire
time, and `fleetq schedules` listing the next tick."""

from __future__ import annotations

import asyncio
import subprocess
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from fleetq.core import config, readers, schedules
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver, open_driver
from fleetq.core.errors import InvalidInput
from fleetq.core.models import JobId
from tests import fleet
from tests.fleet import SHA


@pytest.fixture(autouse=True)
def _fleet(sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)


def _apply(conn: SyncConnection, tmp_path: Path, body: str) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(body)
    config.apply(conn, config.load(path), source=path)


def _created(conn: SyncConnection, name: str) -> datetime:
    (at,) = (
        conn.execute("SELECT last_tick FROM fleetq.schedules WHERE name = $1", [name]).fetchone()
        or ()
    )
    result: datetime = at
    return result


def _hourly(catch_up: str = "last", commit: str = f'commit = "{SHA}"') -> str:
    return (
        f'[schedules.hourly]\ncron = "0 * * * *"\nproject = "tools"\noperation = "lint"\n'
        f'{commit}\ncatch_up = "{catch_up}"\n'
    )


def _jobs(conn: SyncConnection) -> list[tuple[int, str, str]]:
    return [
        tuple(r)
        for r in conn.execute(
            "SELECT id, submitted_by, idempotency_key FROM fleetq.jobs ORDER BY id"
        ).fetchall()
    ]


async def test_a_tick_fires_once_whoever_leads(
    driver: Driver, sync_conn: SyncConnection, tmp_path: Path, db_dsn: str
) -> None:
    _apply(sync_conn, tmp_path, _hourly())
    start = _created(sync_conn, "hourly")
    tick = start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    now = tick + timedelta(seconds=5)
    async with open_driver(db_dsn, kind="asyncpg") as other:
        first, second = await asyncio.gather(
            schedules.fire_due(driver, now), schedules.fire_due(other, now)
        )
    assert len(first) + len(second) == 1  # two leaders at once: one job
    assert await schedules.fire_due(driver, now + timedelta(minutes=5)) == []  # settled
    ((job, by, key),) = _jobs(sync_conn)
    assert by == "schedule:hourly" and key is not None and key.startswith("schedule:hourly:")
    assert (await readers.job(driver, JobId(job))).commit_sha == SHA


@pytest.mark.parametrize(("catch_up", "fired"), [("all", 3), ("last", 1), ("none", 0)])
async def test_ticks_missed_while_nobody_led(
    driver: Driver, sync_conn: SyncConnection, tmp_path: Path, catch_up: str, fired: int
) -> None:
    _apply(sync_conn, tmp_path, _hourly(catch_up))
    start = _created(sync_conn, "hourly")
    now = start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=3, minutes=30)
    assert len(await schedules.fire_due(driver, now)) == fired
    assert len(_jobs(sync_conn)) == fired
    assert _created(sync_conn, "hourly") == now.replace(minute=0)  # every missed tick settled
    assert await schedules.fire_due(driver, now) == []


async def test_a_paused_schedule_fires_nothing_and_resumes_from_now(
    driver: Driver, sync_conn: SyncConnection, tmp_path: Path
) -> None:
    _apply(sync_conn, tmp_path, _hourly("all"))
    with pytest.raises(InvalidInput, match="takes a reason"):
        await schedules.pause(driver, name="hourly", paused=True, reason=" ", actor="ops")
    await schedules.pause(driver, name="hourly", paused=True, reason="repo moving", actor="ops")
    start = _created(sync_conn, "hourly")
    later = start + timedelta(hours=5)
    assert await schedules.fire_due(driver, later) == []
    (listed,) = await schedules.listed(driver)
    assert (listed.paused_reason, listed.next_tick) == ("repo moving", None)
    await schedules.pause(driver, name="hourly", paused=False, reason="", actor="ops")
    resumed = _created(sync_conn, "hourly")
    assert resumed > start  # the ticks of the pause are not fired
    (listed,) = await schedules.listed(driver)
    assert listed.next_tick is not None and listed.next_tick > resumed


def _repo(tmp_path: Path) -> tuple[Path, str]:
    """A git repository with one commit on main, and that commit."""
    repo = tmp_path / "repo"
    git = ["git", "-C", str(repo), "-c", "user.email=t@e", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "one"], check=True)
    done = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    return repo, done.stdout.strip()


async def test_a_branch_is_resolved_when_the_tick_fires(
    driver: Driver, sync_conn: SyncConnection, tmp_path: Path
) -> None:
    repo, head = _repo(tmp_path)
    sync_conn.execute(
        "UPDATE fleetq.projects SET repository = $1 WHERE name = 'tools'", [str(repo)]
    )
    _apply(sync_conn, tmp_path, _hourly(commit='branch = "main"'))
    start = _created(sync_conn, "hourly")
    now = start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1, seconds=1)
    (fired,) = await schedules.fire_due(driver, now)
    assert (await readers.job(driver, JobId(fired.job_id))).commit_sha == head
