"""Schedules: jobs fired on a cron expression, in a time zone, by the reaper's leader.

Which ticks are due is computed here (cronsim, a maintained cron parser; daylight-saving
changes follow the zone); each tick is then settled in the database, where firing it is
one transaction that writes the (schedule, tick) row and submits the job
(`fleetq.fire_schedule`): a leader change neither skips nor doubles a tick, and two
runners leading one after the other settle each tick once.

Catch-up, for ticks missed while no runner led the reaper:
- `all`: every missed tick fires, oldest first (at most `MAX_FIRES` a pass);
- `last` (the default): the newest missed tick fires, the older ones are skipped;
- `none`: only a tick due within `ON_TIME_S` fires; older ones are skipped.

A branch is resolved to its head commit when the tick fires (`git ls-remote` on the
project's repository); if that fails the tick stays due and the next pass tries again.
"""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import datetime
from zoneinfo import ZoneInfo

from cronsim import CronSim
from pydantic import BaseModel, ConfigDict

from fleetq.core import queries
from fleetq.core.driver import Driver

log = logging.getLogger(__name__)

MAX_FIRES = 100  # ticks fired by one pass (catch-up "all" continues on the next)
MAX_TICKS = 100_000  # ticks looked at in one pass (a minute's cron over two months)
ON_TIME_S = 120.0  # catch-up "none": how late a tick may still fire
RESOLVE_TIMEOUT_S = 30.0
_SHA = re.compile(r"[0-9a-f]{40}")


class Schedule(BaseModel):
    """A schedule in force, as the reaper's leader reads it."""

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


async def fire_due(driver: Driver, now: datetime | None = None) -> list[Fired]:
    """Settle every schedule's due ticks (the reaper's leader calls this after its pass).
    A schedule that fails (its branch cannot be resolved, say) is logged and left due;
    the others go on."""
    fired: list[Fired] = []
    for found in await driver.fetch(queries.sql("schedules_in_force")):
        schedule = Schedule.model_validate(found)
        fire, skip = plan(schedule, now or found["now"])
        if skip is not None:
            await driver.fetch(queries.sql("schedules_skip"), schedule.name, skip)
        for tick in fire:
            try:
                commit = await resolve(schedule)
            except (LookupError, OSError) as exc:
                log.warning("schedule %s: tick %s not fired yet: %s", schedule.name, tick, exc)
                break
            (answer,) = await driver.fetch(
                queries.sql("schedules_fire"), schedule.name, tick, commit
            )
            if answer["fired"]:
                fired.append(Fired(schedule=schedule.name, tick=tick, job_id=answer["job_id"]))
    return fired


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
