"""Schedules: jobs fired on a cron expression, in a time zone, by the runners of the
schedule's lane.

Which ticks are due is computed here (cronsim, a maintained cron parser; daylight-saving
changes follow the zone); each tick is then settled in the database, where firing it is
one transaction that writes the (schedule, tick) row and submits the job
(`fleetq.fire_schedule`): runners firing at once, or one after another, settle each tick
once.

Every runner settles the schedules of the lanes it serves (`fleetq.lane_schedules`), and
the database refuses a runner login those of other lanes: a runner of the lane decides
that lane's outcomes already, so resolving a branch gives it nothing new, while a runner
of another lane (another tenant's) gets nothing. A runner looks once a minute, cron's
resolution (`MinuteChecks`): an idle fleet pays one statement a minute per runner. One
runner resolves and fires a tick: it takes the tick's turn first
(`fleetq.take_schedule_turn`), so the runners of a lane do not all run `git ls-remote` at
the minute; a turn lapses (after a minute) when its runner dies mid-resolve.

Catch-up, for ticks missed while no runner of the lane ran:
- `all`: every missed tick fires, oldest first (at most `MAX_FIRES` a look);
- `last` (the default): the newest missed tick fires, the older ones are skipped;
- `none`: only a tick due within `ON_TIME_S` fires; older ones are skipped.

A branch is resolved to its head commit when the tick fires (`git ls-remote` on the
project's repository); if that fails the tick stays due and the next look tries again.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from cronsim import CronSim
from pydantic import BaseModel, ConfigDict

from fleetq.core import queries
from fleetq.core.driver import Driver
from fleetq.core.models import RunnerId

log = logging.getLogger(__name__)

MAX_FIRES = 100  # ticks fired by one look (catch-up "all" continues on the next)
MAX_TICKS = 100_000  # ticks looked at in one look (a minute's cron over two months)
ON_TIME_S = 120.0  # catch-up "none": how late a tick may still fire
# a turn lapses after 60 s (fleetq.take_schedule_turn): a resolve must end well before
RESOLVE_TIMEOUT_S = 30.0
MINUTE_S = 60.0  # cron's resolution: how often a runner looks for due ticks
_SHA = re.compile(r"[0-9a-f]{40}")


class Schedule(BaseModel):
    """A schedule in force, as a runner of its lane reads it."""

    model_config = ConfigDict(frozen=True)

    name: str
    cron: str
    timezone: str
    commit_sha: str | None
    branch: str | None
    repository: str
    catch_up: str
    last_tick: datetime


class Fired(BaseModel):
    """One tick fired."""

    schedule: str
    tick: datetime
    job_id: int


def ticks(cron: str, zone: str, after: datetime, until: datetime) -> list[datetime]:
    """The ticks of `cron` in `zone` in (after, until], oldest first (at most MAX_TICKS)."""
    found: list[datetime] = []
    for tick in CronSim(cron, after.astimezone(ZoneInfo(zone))):
        if tick > until or len(found) >= MAX_TICKS:
            break
        found.append(tick)
    return found


def next_tick(cron: str, zone: str, after: datetime) -> datetime:
    """The first tick after `after`."""
    return next(iter(CronSim(cron, after.astimezone(ZoneInfo(zone)))))


def plan(schedule: Schedule, now: datetime) -> tuple[list[datetime], datetime | None]:
    """The ticks to fire now, and the tick through which the rest are skipped (or None)."""
    due = ticks(schedule.cron, schedule.timezone, schedule.last_tick, now)
    if not due:
        return [], None
    if schedule.catch_up == "all":
        return due[:MAX_FIRES], None
    newest, older = due[-1], due[:-1]
    skip = older[-1] if older else None
    if schedule.catch_up == "none" and (now - newest).total_seconds() > ON_TIME_S:
        return [], newest
    return [newest], skip


async def resolve(schedule: Schedule) -> str:
    """The commit a tick checks: the fixed one, or the branch's head now."""
    if schedule.commit_sha is not None:
        return schedule.commit_sha
    ref = f"refs/heads/{schedule.branch}"
    proc = await asyncio.create_subprocess_exec(
        "git",
        "ls-remote",
        "--",
        schedule.repository,
        ref,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), RESOLVE_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise LookupError(f"git ls-remote {schedule.repository} timed out") from None
    for line in out.decode(errors="replace").splitlines():
        sha, _, name = line.partition("\t")
        if name == ref and _SHA.fullmatch(sha):
            return sha
    detail = err.decode(errors="replace").strip().splitlines()
    raise LookupError(
        f"branch {schedule.branch} not found in {schedule.repository}"
        + (f": {detail[-1]}" if detail else "")
    )


async def fire_due(driver: Driver, runner: RunnerId, now: datetime | None = None) -> list[Fired]:
    """Settle the due ticks of the schedules of `runner`'s lanes as of `now` (by default
    the database's clock)."""
    rows = await _in_force(driver, runner)
    return await _settle_all(driver, runner, rows, now or rows[0]["now"])


class MinuteChecks:
    """When a runner looks for due ticks: on its first pass, then on its first pass after
    each minute of the database's clock, so its passes may come every few seconds while
    schedules cost one statement a minute. The minute is the database's, as the ticks'
    dueness is: a runner whose clock ran ahead would look just before a tick is due, and
    fire it a minute late. A look that fails is tried again at the next pass."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._next: float | None = None  # the monotonic time of the next minute

    async def check(self, driver: Driver, runner: RunnerId) -> list[Fired]:
        """Settle `runner`'s lanes' due ticks if a minute began since the last look."""
        if self._next is not None and self._clock() < self._next:
            return []
        rows = await _in_force(driver, runner)
        listed = self._clock()  # no earlier than the database's `now` below
        fired = await _settle_all(driver, runner, rows, rows[0]["now"])
        self._next = listed + until_next_minute(rows[0]["now"])
        return fired


def until_next_minute(now: datetime) -> float:
    """Seconds from `now` to the next whole minute (a whole minute: one minute)."""
    return MINUTE_S - (now.second + now.microsecond / 1_000_000)


async def _in_force(driver: Driver, runner: RunnerId) -> list[dict[str, Any]]:
    """The schedules in force of `runner`'s lanes that no other runner has the turn on,
    each row with the database's clock (one row with it alone when there are none)."""
    return await driver.fetch(queries.sql("schedules_of_lanes"), runner)


async def _settle_all(
    driver: Driver, runner: RunnerId, rows: list[dict[str, Any]], now: datetime
) -> list[Fired]:
    """Settle each listed schedule. A schedule that fails (its branch cannot be resolved,
    say) is logged and left due; the others go on."""
    fired: list[Fired] = []
    for row in rows:
        if row["name"] is not None:
            fired += await _settle(driver, runner, Schedule.model_validate(row), now)
    return fired


async def _settle(
    driver: Driver, runner: RunnerId, schedule: Schedule, now: datetime
) -> list[Fired]:
    """Skip and fire what the catch-up rule says, each tick under this runner's turn (a
    tick whose turn another runner has is that runner's to settle)."""
    fire, skip = plan(schedule, now)
    first = fire[0] if fire else skip
    if first is None or not await _take_turn(driver, runner, schedule, first):
        return []
    if skip is not None:
        await driver.fetch(queries.sql("schedules_skip"), schedule.name, skip)
    fired: list[Fired] = []
    for tick in fire:
        if tick != first and not await _take_turn(driver, runner, schedule, tick):
            break  # another runner of the lane goes on from here
        try:
            commit = await resolve(schedule)
        except (LookupError, OSError) as exc:
            log.warning("schedule %s: tick %s not fired yet: %s", schedule.name, tick, exc)
            break
        (answer,) = await driver.fetch(queries.sql("schedules_fire"), schedule.name, tick, commit)
        if answer["fired"]:
            fired.append(Fired(schedule=schedule.name, tick=tick, job_id=answer["job_id"]))
    return fired


async def _take_turn(driver: Driver, runner: RunnerId, schedule: Schedule, tick: datetime) -> bool:
    """Whether this runner has the turn on `tick` (taken now, or still its own)."""
    (row,) = await driver.fetch(queries.sql("schedules_take_turn"), runner, schedule.name, tick)
    return bool(row["taken"])


class Listed(BaseModel):
    """A schedule as `fleetq schedules` shows it."""

    name: str
    cron: str
    timezone: str
    project: str
    operation: str
    commit_sha: str | None
    branch: str | None
    catch_up: str
    last_tick: datetime
    paused_at: datetime | None
    paused_by: str | None
    paused_reason: str | None
    last_fired: datetime | None
    last_job: int | None
    next_tick: datetime | None = None  # None while paused


async def listed(driver: Driver, now: datetime | None = None) -> list[Listed]:
    """Every schedule, with its next tick (after `now`, by default the database's clock)
    and its last job."""
    if now is None:
        (row,) = await driver.fetch(queries.sql("views_now"))
        now = row["now"]
    assert now is not None
    found = [Listed.model_validate(r) for r in await driver.fetch(queries.sql("schedules_list"))]
    return [
        s
        if s.paused_at is not None
        else s.model_copy(
            update={"next_tick": next_tick(s.cron, s.timezone, max(now, s.last_tick))}
        )
        for s in found
    ]


async def pause(driver: Driver, *, name: str, paused: bool, reason: str, actor: str) -> None:
    """Pause (a reason is required) or resume a schedule."""
    await driver.fetch(queries.sql("schedules_pause"), name, paused, reason, actor)


async def remove(driver: Driver, *, name: str, actor: str) -> bool:
    """Remove a schedule (the jobs it fired stay); False when there was none."""
    (row,) = await driver.fetch(queries.sql("schedules_remove"), name, actor)
    return bool(row["removed"])
