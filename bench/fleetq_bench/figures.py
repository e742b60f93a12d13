"""The benchmarks' arithmetic, apart from any database or clock, so it can be tested alone.

Percentiles interpolate linearly between the two nearest ranks, as PostgreSQL's
`percentile_cont` does, so a figure computed here and one `fleetq-bench` reads from the
database mean the same thing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PERCENTILES = (50, 95, 99)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0-100) of `values` by linear interpolation; None when empty."""
    if not 0 <= p <= 100:
        raise ValueError(f"a percentile is between 0 and 100, not {p}")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(
    values: Sequence[float], *, scale: float = 1.0, points: Iterable[int] = PERCENTILES
) -> dict[str, float | int | None]:
    """`n` and the percentiles of `values` times `scale` (1000: seconds to ms), rounded to
    hundredths; None for each percentile when nothing was measured."""
    found: dict[str, float | int | None] = {"n": len(values)}
    for p in points:
        v = percentile(values, p)
        found[f"p{p}"] = None if v is None else round(v * scale, 2)
    return found


def per_second(count: float, seconds: float) -> float | None:
    """A rate rounded to tenths; None when no time passed (nothing to divide by)."""
    if seconds <= 0:
        return None
    return round(count / seconds, 1)


def idle_cadence(
    *,
    beat_s: float,
    reap_s: float,
    ping_s: float,
    poll_max_s: float,
    collect_s: float,
    schedules_s: float,
) -> float:
    """Transactions per second one idle runner is expected to cost, from its loops'
    cadence: a heartbeat and the read of its own state per beat, a reaper pass, a ping
    of its LISTEN session, a claim poll once the polls have backed off to their longest
    wait, the two reads of a collection pass, and a look for its lanes' due ticks."""
    for name, value in (
        ("beat", beat_s),
        ("reap", reap_s),
        ("ping", ping_s),
        ("poll", poll_max_s),
        ("collection", collect_s),
        ("schedules", schedules_s),
    ):
        if value <= 0:
            raise ValueError(f"the {name} interval must be positive, not {value}")
    loops = 2 / beat_s + 1 / reap_s + 1 / ping_s + 1 / poll_max_s + 2 / collect_s
    return loops + 1 / schedules_s


def counter_delta(before: int, after: int, *, own: int = 0) -> int:
    """What a cumulative counter moved by between two reads, less `own` (the reads' own
    transactions); never negative (a counter reset reads as nothing, not as a loss)."""
    return max(0, after - before - own)


def explain_buffers(plan: Mapping[str, Any]) -> dict[str, int]:
    """Shared buffers hit and read by a plan (EXPLAIN/auto_explain JSON, `{"Plan": …}` or
    the node itself): the top node's figures include its children's."""
    node = plan.get("Plan", plan)
    if not isinstance(node, dict):
        raise ValueError("not an EXPLAIN plan")
    return {
        "shared_hit": int(node.get("Shared Hit Blocks", 0)),
        "shared_read": int(node.get("Shared Read Blocks", 0)),
    }
