"""The few statistics the benchmarks report, computed one way for every system.

Percentiles interpolate linearly between the two nearest ranks, as PostgreSQL's
`percentile_cont` does, so a figure read from fleetq's tables and one read from a peer's
sample files mean the same thing. Runs are summarised by their median and their range:
with three runs a mean would let one disturbed run move the headline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

PERCENTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))


def percentile(values: Sequence[float], fraction: float) -> float:
    """The `fraction` percentile of `values` (not empty), as `percentile_cont` answers."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = fraction * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p95 and p99 rounded to 0.01 (None each when nothing was measured)."""
    return {name: round(percentile(values, f), 2) if values else None for name, f in PERCENTILES}


def median(values: Sequence[float]) -> float:
    """The middle value (the mean of the two middle ones for an even count)."""
    return percentile(values, 0.5)


def spread(values: Sequence[float | None]) -> dict[str, float | None]:
    """Median, min and max of one figure over runs; None values (not measured) are left
    out, and a figure no run measured is None throughout."""
    known = [v for v in values if v is not None]
    if not known:
        return {"median": None, "min": None, "max": None}
    return {"median": _round(median(known)), "min": _round(min(known)), "max": _round(max(known))}


def flatten(report: Mapping[str, Any], prefix: str = "") -> dict[str, float | None]:
    """Every numeric leaf of a nested report, keyed by its dotted path (booleans and
    text are descriptions, not figures, and are left out)."""
    out: dict[str, float | None] = {}
    for key, value in report.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{path}."))
        elif value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
            out[path] = None if value is None else float(value)
    return out


def aggregate(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per figure (dotted path), its median and min-max over `runs`; a figure missing
    from a run counts as not measured there."""
    flat = [flatten(run) for run in runs]
    paths = sorted({path for run in flat for path in run})
    return {path: spread([run.get(path) for run in flat]) for path in paths}


def _round(value: float) -> float:
    """Three significant decimals are plenty for any figure here."""
    return round(value, 3)
