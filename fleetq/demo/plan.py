"""When things happen in a demo run, and what the run has done so far.

Every moment is a fraction of the run's duration, so a 20-second CI run and the default
minute tell the same story: the fault lands a third of the way in and heals before two
thirds, the cancel comes after it, and the stream ends at the duration.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

# Pacing steps, not synchronisation: every wait checks its stop event at least this often.
TICK_S = 0.1


@dataclass(frozen=True)
class Plan:
    """The run's timetable, in seconds from the start of the job stream."""

    duration_s: float
    lease_s: int
    submit_every_s: float = 0.35
    progress_every_s: float = 5.0
    settle_s: float = 90.0  # after the stream: how long the queue may take to drain

    @property
    def fault_at(self) -> float:
        """SIGSTOP one runner a third of the way in."""
        return self.duration_s / 3

    @property
    def heal_by(self) -> float:
        """SIGCONT at the latest here: before two thirds, but never before the lease could
        expire and the job be claimed again (short runs)."""
        return max(2 * self.duration_s / 3, self.fault_at + self.lease_s + 6)

    @property
    def cancel_at(self) -> float:
        """Cancel one running job halfway (after the heal, when that comes later)."""
        return self.duration_s / 2

    @property
    def interval_s(self) -> float:
        """The report's completed-per-interval step: about a dozen rows."""
        return max(5.0, round(self.duration_s / 12 / 5) * 5)


@dataclass
class Fault:
    """The runner frozen past its lease, and what came of it."""

    runner: str
    held: list[int]
    frozen_at: datetime
    healed_at: datetime | None = None
    overlap_seen: bool = False


@dataclass
class RunLog:
    """What the run did: the jobs it had accepted (the report accounts for each), its
    repeats, its fault and its cancel. Written by the stream thread, read after it ends."""

    tag: str
    started_at: datetime | None = None
    jobs: set[int] = field(default_factory=set)
    submits: int = 0
    repeats: int = 0  # submits answered with the existing job (same idempotency key)
    fault: Fault | None = None
    cancelled: int | None = None
    timeline: list[str] = field(default_factory=list)


class Clock:
    """Seconds since the stream began, and waits that end early when the run is stopped."""

    def __init__(self, stop: threading.Event, say: Callable[[str], None]) -> None:
        self.stop = stop
        self.t0 = time.monotonic()
        self._say = say

    def now(self) -> float:
        """Seconds since the start."""
        return time.monotonic() - self.t0

    def say(self, line: str) -> None:
        """A progress line stamped with the run's time."""
        self._say(f"[{self.now():5.1f}s] {line}")

    async def until(self, at: float) -> bool:
        """Wait until `at` seconds into the run; False if the run was stopped first."""
        while not self.stop.is_set():
            left = at - self.now()
            if left <= 0:
                return True
            await asyncio.sleep(min(TICK_S, left))
        return False

    async def sleep(self, seconds: float) -> bool:
        """Wait `seconds`; False if the run was stopped first."""
        return await self.until(self.now() + seconds)
