"""Pruning history: `fleetq prune --before DATE`.

Why: a long-lived fleet's history (jobs, executions, events, verdicts, output) grows
without bound. The claim does not slow down with it (it walks partial indexes of live
jobs only), but the disk, backups, vacuums and every reader of history do.

What goes, as stated once in `migrations/protocol/prune.sql` (`fleetq.job_prunable`):
a job whose whole record is older than the cutoff (it ended before it, and nothing was
recorded about it since), with every row that names it: executions, events, verdicts,
output, dependency edges at both ends, task notifications, schedule ticks. Then the
events tied to no job that are older than the cutoff. What stays:

- every job that has not ended (waiting, queued, claimed, running), or ended later;
- a job still settling: a cancelled job whose runner has not confirmed the stop (it holds
  that runner's capacity), a run whose end its runner has not reported (the runner will
  name the job), anything recorded about it since the cutoff;
- a job that a job which stays depends on, directly or down a chain, so a waiting job's
  dependencies still resolve and a kept job keeps what it waited for;
- a job whose row another transaction holds: skipped, never waited for (a later prune
  takes it);
- the newest event, so max(events.id) never goes back: the console polls it to notice
  news (`console/live.py` takes any change as news, so a drop would cost one reload),
  and a reader that keeps it as a cursor may assume it only grows. If it belongs to a
  pruned job it stays alone, and a later prune takes it once newer events exist;
- the fenced ledger and its writes: the fenced resource's own state, keyed by resource
  (forgetting a key's highest token would let a stale token write again).

What an operator should know: a pruned job is gone for good. `fleetq result` no longer
knows its verdict (unless a newer job checked the same commit), `submit --after` can no
longer name it, and its idempotency key is free again: a submit retried after a prune
makes a new job. Choose the cutoff longer than any producer retries.

Batches: each batch is one call, one transaction, over the next `batch` jobs (then
events) in id order, so a prune of millions of rows never holds a long transaction and
locks only jobs that ended, each for one batch. The walk stops at the first batch
submitted wholly after the cutoff. An interrupted prune leaves every finished batch
done; running it again goes on. Only an administrator (a superuser or a member of
`fleetq_owner`) may prune: no group is granted the functions.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Literal, LiteralString

from pydantic import BaseModel, Field

from fleetq.core import queries
from fleetq.core.driver import Driver
from fleetq.core.errors import InvalidInput, PermissionDenied

BATCH = 5000  # jobs (then events) read per transaction
BATCH_TIMEOUT_S = 600.0  # one batch's statement may take long on a slow disk
_AGE = re.compile(r"\s*(\d{1,6})\s*([smhdw])\s*")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_before(text: str) -> datetime | timedelta:
    """DATE as typed: an age (`30d`, `12h`, `90m`, `45s`, `2w`), counted back from the
    database's clock when the prune starts, or an ISO 8601 date or timestamp (one
    without a zone is this machine's local time)."""
    if match := _AGE.fullmatch(text):
        return timedelta(**{_UNITS[match[2]]: int(match[1])})
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidInput(
            f"DATE must be an ISO date or timestamp (2024-05-01, 2024-05-01T12:00Z) or an "
            f"age (30d, 12h, 90m, 45s, 2w), not {text!r}"
        ) from None
    return moment if moment.tzinfo is not None else moment.astimezone()


class Removed(BaseModel):
    """Rows removed (or, in a dry run, that would be), per table."""

    jobs: int = 0
    executions: int = 0
    events: int = 0
    verdicts: int = 0
    outputs: int = 0  # chunks of job output
    dependencies: int = 0  # edges, named from either end
    notifications: int = 0  # task-thread notifications
    ticks: int = 0  # schedule ticks that fired a pruned job

    def __add__(self, other: Removed) -> Removed:
        return Removed(**{k: v + getattr(other, k) for k, v in self})

    @property
    def rows(self) -> int:
        """Every row, jobs included."""
        return sum(v for _, v in self)


class Kept(BaseModel):
    """Jobs that ended before the cutoff but stay, by reason (each counted once)."""

    held: int = 0  # another transaction held its row: a later prune takes it
    unsettled: int = 0  # a stop or a run's end not yet reported, or news since the cutoff
    needed: int = 0  # a job that stays depends on it

    def __add__(self, other: Kept) -> Kept:
        return Kept(**{k: v + getattr(other, k) for k, v in self})

    @property
    def total(self) -> int:
        """All of them."""
        return self.held + self.unsettled + self.needed


class Batch(BaseModel):
    """One committed batch (one transaction), as the progress callback sees it."""

    phase: Literal["jobs", "events"]
    number: int  # within its phase, from 1
    first_id: int  # the slice read: ids first_id..last_id of the phase's table
    last_id: int
    removed: Removed
    kept: Kept
    seconds: float


class Summary(BaseModel):
    """What a prune did (`fleetq prune --json`)."""

    before: datetime  # the cutoff, on the database's clock
    dry_run: bool
    batches: int = 0
    removed: Removed = Field(default_factory=Removed)
    kept: Kept = Field(default_factory=Kept)
    seconds: float = 0.0

    def add(self, batch: Batch) -> None:
        """Count one batch in."""
        self.batches += 1
        self.removed += batch.removed
        self.kept += batch.kept


Progress = Callable[[Batch], None]


async def cutoff(driver: Driver, before: datetime | timedelta) -> datetime:
    """The cutoff on the database's clock (an age is counted back from it), before
    anything is read: refused when it is not in the past, or when this login is not an
    administrator's."""
    absolute, age = (before, None) if isinstance(before, datetime) else (None, before)
    (row,) = await driver.fetch(queries.sql("prune_cutoff"), absolute, age)
    if not row["allowed"]:
        raise PermissionDenied(
            "only an administrator (a superuser or a member of fleetq_owner) may prune "
            "history; this login is not one"
        )
    if row["before"] > row["now"]:
        raise InvalidInput(
            f"DATE {row['before']:%Y-%m-%d %H:%M:%S %Z} is not in the past (the database's "
            f"clock says {row['now']:%Y-%m-%d %H:%M:%S %Z}): prune removes only history"
        )
    return row["before"]  # type: ignore[no-any-return]


async def prune(
    driver: Driver,
    *,
    before: datetime | timedelta,
    batch: int = BATCH,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> Summary:
    """Remove the history that ended before `before`, `batch` jobs (then events) per
    transaction; with `dry_run`, count it and delete nothing. `progress` sees each batch
    once it is committed."""
    if batch < 1:
        raise InvalidInput(f"--batch must be at least 1 (got {batch})")
    started = time.monotonic()
    summary = Summary(before=await cutoff(driver, before), dry_run=dry_run)
    walk = _Walk(driver, summary, batch, progress)
    await walk.phase("jobs", queries.sql("prune_jobs"))
    await walk.phase("events", queries.sql("prune_events"))
    summary.seconds = round(time.monotonic() - started, 3)
    return summary


class _Walk:
    """One prune's walk through a table, a batch at a time, each its own transaction."""

    def __init__(
        self, driver: Driver, summary: Summary, batch: int, progress: Progress | None
    ) -> None:
        self.driver, self.summary, self.batch, self.progress = driver, summary, batch, progress

    async def phase(self, phase: Literal["jobs", "events"], query: LiteralString) -> None:
        """Call `query` batch after batch until it says the rest is newer than the cutoff."""
        after, more, number = 0, True, 0
        while more:
            begun = time.monotonic()
            row = await self._call(query, after)
            number += 1
            step = Batch(
                phase=phase,
                number=number,
                first_id=after + 1,
                last_id=row["last_id"],
                removed=Removed.model_validate(row),
                kept=Kept.model_validate(row),
                seconds=round(time.monotonic() - begun, 3),
            )
            self.summary.add(step)
            if self.progress is not None:
                self.progress(step)
            after, more = int(row["last_id"]), bool(row["more"])

    async def _call(self, query: LiteralString, after: int) -> dict[str, Any]:
        (row,) = await self.driver.fetch(
            query,
            self.summary.before,
            after,
            self.batch,
            self.summary.dry_run,
            timeout=BATCH_TIMEOUT_S,
        )
        return row
