"""Schedules fired by the runners of their lane: one job per tick whoever fires it (two
runners at once included), one branch resolve per tick (a tick's turn is one runner's,
and lapses when that runner dies), a runner looking once a minute and at its own lanes'
schedules only, the catch-up rules, pausing with a reason, a branch resolved at fire time,
and `fleetq schedules` listing the next tick."""

from __future__ import annotations

import asyncio
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, LiteralString

import pytest

from fleetq.core import config, readers, schedules
from fleetq.core.db import SyncConnection
from fleetq.core.driver import DEFAULT_TIMEOUT_S, Driver, open_driver
from fleetq.core.errors import InvalidInput
from fleetq.core.models import JobId, RunnerId
from tests import fleet
from tests.fleet import SHA


@pytest.fixture(autouse=True)
def _fleet(sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)


@pytest.fixture
async def runner(driver: Driver) -> RunnerId:
    """node-a/r1, serving the checks lane (tools/lint's) and control."""
    return await fleet.runner(driver)


@pytest.fixture
async def peer(driver: Driver) -> RunnerId:
    """node-b/r2, serving the same lanes."""
    return await fleet.runner(driver, "r2", node="node-b")


@pytest.fixture
def resolves(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The schedules whose commit a runner resolved, once per resolve (a branch's: one
    `git ls-remote` each)."""
    seen: list[str] = []
    real = schedules.resolve

    async def counted(schedule: schedules.Schedule) -> str:
        seen.append(schedule.name)
        return await real(schedule)

    monkeypatch.setattr(schedules, "resolve", counted)
    return seen


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


async def test_a_tick_fires_once_whoever_fires_it(
    driver: Driver,
    sync_conn: SyncConnection,
    tmp_path: Path,
    db_dsn: str,
    runner: RunnerId,
    peer: RunnerId,
) -> None:
    _apply(sync_conn, tmp_path, _hourly())
    start = _created(sync_conn, "hourly")
    tick = start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    now = tick + timedelta(seconds=5)
    async with open_driver(db_dsn, kind="asyncpg") as other:
        first, second = await asyncio.gather(
            schedules.fire_due(driver, runner, now), schedules.fire_due(other, peer, now)
        )
    assert len(first) + len(second) == 1  # two runners of the lane at once: one job
    assert await schedules.fire_due(driver, runner, now + timedelta(minutes=5)) == []  # settled
    ((job, by, key),) = _jobs(sync_conn)
    assert by == "schedule:hourly" and key is not None and key.startswith("schedule:hourly:")
    assert (await readers.job(driver, JobId(job))).commit_sha == SHA


def test_a_tick_not_after_the_last_one_fires_nothing(
    sync_conn: SyncConnection, tmp_path: Path
) -> None:
    """A tick from before the schedule existed (or at its last tick) is settled already
    (issue 43, finding 3: without the last-tick check a Berlin `15 2 * * *` schedule
    fired a tick from before it existed, at the autumn change)."""
    _apply(sync_conn, tmp_path, _hourly())
    start = _created(sync_conn, "hourly")
    for tick in (start - timedelta(hours=1), start):
        fired = sync_conn.execute(
            "SELECT job_id, fired FROM fleetq.fire_schedule('hourly', $1, $2)", [tick, SHA]
        ).fetchone()
        assert fired is not None and tuple(fired) == (None, False)
    assert _jobs(sync_conn) == []


@pytest.mark.parametrize(("catch_up", "fired"), [("all", 3), ("last", 1), ("none", 0)])
async def test_ticks_missed_while_no_runner_of_the_lane_ran(
    driver: Driver,
    sync_conn: SyncConnection,
    tmp_path: Path,
    runner: RunnerId,
    catch_up: str,
    fired: int,
) -> None:
    _apply(sync_conn, tmp_path, _hourly(catch_up))
    start = _created(sync_conn, "hourly")
    now = start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=3, minutes=30)
    assert len(await schedules.fire_due(driver, runner, now)) == fired
    assert len(_jobs(sync_conn)) == fired
    assert _created(sync_conn, "hourly") == now.replace(minute=0)  # every missed tick settled
    assert await schedules.fire_due(driver, runner, now) == []


async def test_a_paused_schedule_fires_nothing_and_resumes_from_now(
    driver: Driver, sync_conn: SyncConnection, tmp_path: Path, runner: RunnerId
) -> None:
    _apply(sync_conn, tmp_path, _hourly("all"))
    with pytest.raises(InvalidInput, match="takes a reason"):
        await schedules.pause(driver, name="hourly", paused=True, reason=" ", actor="ops")
    await schedules.pause(driver, name="hourly", paused=True, reason="repo moving", actor="ops")
    start = _created(sync_conn, "hourly")
    later = start + timedelta(hours=5)
    assert await schedules.fire_due(driver, runner, later) == []
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


def _branch(conn: SyncConnection, tmp_path: Path) -> str:
    """The hourly schedule on the branch main of a local repository; its head."""
    repo, head = _repo(tmp_path)
    conn.execute("UPDATE fleetq.projects SET repository = $1 WHERE name = 'tools'", [str(repo)])
    _apply(conn, tmp_path, _hourly(commit='branch = "main"'))
    return head


def _first_tick(conn: SyncConnection) -> datetime:
    """Just after the hourly schedule's first tick."""
    start = _created(conn, "hourly")
    return start.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1, seconds=1)


async def test_a_branch_is_resolved_when_the_tick_fires(
    driver: Driver, sync_conn: SyncConnection, tmp_path: Path, runner: RunnerId
) -> None:
    head = _branch(sync_conn, tmp_path)
    (fired,) = await schedules.fire_due(driver, runner, _first_tick(sync_conn))
    assert (await readers.job(driver, JobId(fired.job_id))).commit_sha == head


async def test_runners_of_a_lane_resolve_a_tick_once(
    driver: Driver,
    sync_conn: SyncConnection,
    tmp_path: Path,
    db_dsn: str,
    runner: RunnerId,
    peer: RunnerId,
    resolves: list[str],
) -> None:
    """Two runners of the lane at the same minute: one `git ls-remote`, one job."""
    _branch(sync_conn, tmp_path)
    now = _first_tick(sync_conn)
    async with open_driver(db_dsn, kind="asyncpg") as other:
        first, second = await asyncio.gather(
            schedules.fire_due(driver, runner, now), schedules.fire_due(other, peer, now)
        )
    assert (len(first) + len(second), resolves) == (1, ["hourly"])
    assert len(_jobs(sync_conn)) == 1


async def _take_turn(driver: Driver, runner: RunnerId, tick: datetime) -> bool:
    (row,) = await driver.fetch(
        "SELECT fleetq.take_schedule_turn($1, 'hourly', $2) AS taken", runner, tick
    )
    return bool(row["taken"])


def _due_tick(now: datetime) -> datetime:
    return now.replace(second=0, microsecond=0)


async def test_a_tick_s_turn_is_one_runner_s(
    driver: Driver,
    sync_conn: SyncConnection,
    tmp_path: Path,
    runner: RunnerId,
    peer: RunnerId,
    resolves: list[str],
) -> None:
    """While a runner of the lane has the turn on a tick (it is resolving the branch),
    another neither resolves nor fires it; the turn's holder does, once."""
    _branch(sync_conn, tmp_path)
    now = _first_tick(sync_conn)
    assert await _take_turn(driver, runner, _due_tick(now))
    assert not await _take_turn(driver, peer, _due_tick(now))
    assert (await schedules.fire_due(driver, peer, now), resolves) == ([], [])
    assert len(await schedules.fire_due(driver, runner, now)) == 1
    assert await schedules.fire_due(driver, peer, now) == []
    assert (resolves, len(_jobs(sync_conn))) == (["hourly"], 1)
    assert not await _take_turn(driver, peer, _due_tick(now))  # settled: nobody's turn


async def test_a_turn_lapses_when_its_runner_dies(
    driver: Driver,
    sync_conn: SyncConnection,
    tmp_path: Path,
    runner: RunnerId,
    peer: RunnerId,
    resolves: list[str],
) -> None:
    """A runner that took the turn and died mid-resolve holds the tick back until the
    turn lapses (longer than a resolve may take), then another runner fires it."""
    head = _branch(sync_conn, tmp_path)
    now = _first_tick(sync_conn)
    assert await _take_turn(driver, runner, _due_tick(now))
    (row,) = await driver.fetch(
        "SELECT extract(epoch FROM resolving_until - clock_timestamp())::float8 AS left_s "
        "FROM fleetq.schedules WHERE name = 'hourly'"
    )
    assert schedules.RESOLVE_TIMEOUT_S < row["left_s"] <= 60
    assert await schedules.fire_due(driver, peer, now) == []
    # the database's clock passes the turn's end (its runner never came back)
    sync_conn.execute(
        "UPDATE fleetq.schedules SET resolving_until = clock_timestamp() WHERE name = 'hourly'"
    )
    (fired,) = await schedules.fire_due(driver, peer, now)
    assert (await readers.job(driver, JobId(fired.job_id))).commit_sha == head
    assert resolves == ["hourly"]


async def test_a_runner_settles_the_schedules_of_its_lanes_only(
    driver: Driver, sync_conn: SyncConnection, tmp_path: Path, runner: RunnerId
) -> None:
    _apply(sync_conn, tmp_path, _hourly())
    other = await fleet.runner(driver, "r3", node="node-c", lanes={"control": 1})
    now = _first_tick(sync_conn)
    assert await schedules.fire_due(driver, other, now) == []  # tools/lint is the checks lane's
    assert len(await schedules.fire_due(driver, runner, now)) == 1


class _Counted:
    """A driver that counts the statements it runs."""

    def __init__(self, inner: Driver) -> None:
        self.inner, self.statements = inner, 0

    async def fetch(
        self, query: LiteralString, *args: object, timeout: float = DEFAULT_TIMEOUT_S
    ) -> list[dict[str, Any]]:
        self.statements += 1
        return await self.inner.fetch(query, *args, timeout=timeout)

    async def close(self) -> None:
        await self.inner.close()


async def test_a_runner_looks_for_due_ticks_once_a_minute(
    driver: Driver, sync_conn: SyncConnection, tmp_path: Path, runner: RunnerId
) -> None:
    """At start, then on the first pass after each minute: an idle runner's passes every
    few seconds cost one statement a minute."""
    clock = [1000.0]
    checks = schedules.MinuteChecks(clock=lambda: clock[0])
    counted = _Counted(driver)
    assert await checks.check(counted, runner) == []
    assert counted.statements == 1  # at start; nothing in force: one statement
    for _ in range(12):  # a minute's reaper passes, the minute not over yet
        clock[0] += 0.001
        assert await checks.check(counted, runner) == []
    assert counted.statements == 1
    _apply(sync_conn, tmp_path, _hourly())
    sync_conn.execute("UPDATE fleetq.schedules SET last_tick = last_tick - interval '1 hour'")
    clock[0] += schedules.MINUTE_S  # the next minute began
    assert len(await checks.check(counted, runner)) == 1
    assert counted.statements == 4  # the look, the turn, the fire
