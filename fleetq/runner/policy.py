"""The claim policy: how much a claim asks for, when to look again, how often to renew.

Pure arithmetic, no I/O, so the runner's claim loops and outcome batches and the bench's
simulated runner (`bench/fleetq_bench/simrunner.py`) size and pace their claims by the
same rules rather than by copies held equal by a test.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TypeVar

K = TypeVar("K")

MIN_BEAT_S = 0.2  # renewals are never sent closer together than this


def claim_limit(*, batch: int, slots: int, running: int) -> int:
    """How many jobs a claim asks for: the lane's free slots, at most a batch; below 1,
    the lane is full and no claim is sent."""
    return min(batch, slots - running)


def more_behind(*, taken: int, limit: int) -> bool:
    """A claim that took all it asked for may have left more right behind it: claim again
    at once rather than wait."""
    return taken == limit


def next_wait(idle_wait: float, *, poll_s: float, poll_max_s: float) -> float:
    """The wait after a poll that found nothing and was not woken: doubled, up to the
    ceiling (never below the poll interval, whatever the settings say)."""
    return min(idle_wait * 2, max(poll_max_s, poll_s))


def refill_lane(ran: Mapping[K, str]) -> tuple[str, list[K]] | None:
    """The lane a batch of outcomes refills: the one most of its jobs ran in, with those
    jobs (their room is what the refill claims). None for no jobs."""
    if not ran:
        return None
    lane, _ = Counter(ran.values()).most_common(1)[0]
    return lane, [job for job, ran_in in ran.items() if ran_in == lane]


def refill_limit(*, batch: int, slots: int, running: int, freed: int) -> int:
    """How many jobs the claim sent with outcomes asks for: the room the outcomes free in
    their lane plus what is free there already, at most a batch; below 1, none is sent."""
    return min(batch, slots - running + freed)


def beat_s(lease_s: float, offline_s: float) -> float:
    """The runner's heartbeat interval: often enough for its lease setting and for the
    offline threshold alike, so two renewals may fail before either runs out."""
    return max(MIN_BEAT_S, min(lease_s, offline_s) / 3)
