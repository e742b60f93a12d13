"""The benchmark's statistics: one way to take percentiles, medians and ranges."""

from __future__ import annotations

from typing import Any

import pytest

from fleetq_bench import stats
from fleetq_bench.compare import markdown, rotated
from fleetq_bench.peers import SYSTEMS, System, select


def test_percentile_interpolates_as_percentile_cont() -> None:
    # percentile_cont(0.5 / 0.95) WITHIN GROUP over 1..10: 5.5 and 9.55
    values = [float(v) for v in range(10, 0, -1)]
    assert stats.percentile(values, 0.5) == pytest.approx(5.5)
    assert stats.percentile(values, 0.95) == pytest.approx(9.55)
    assert stats.percentile(values, 0.0) == 1.0
    assert stats.percentile(values, 1.0) == 10.0
    assert stats.percentile([3.0], 0.99) == 3.0


def test_percentile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        stats.percentile([], 0.5)


def test_percentiles_name_p50_p95_p99_and_are_none_without_samples() -> None:
    assert stats.percentiles([1.0, 2.0, 3.0]) == {"p50": 2.0, "p95": 2.9, "p99": 2.98}
    assert stats.percentiles([]) == {"p50": None, "p95": None, "p99": None}


def test_median_of_odd_and_even_counts() -> None:
    assert stats.median([5.0, 1.0, 3.0]) == 3.0
    assert stats.median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_spread_leaves_unmeasured_runs_out() -> None:
    assert stats.spread([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert stats.spread([None, None]) == {"median": None, "min": None, "max": None}


def test_flatten_keeps_numbers_and_nulls_only() -> None:
    report = {
        "system": "fleetq",
        "ok": True,
        "throughput": {"jobs_per_s": 10, "costs": {"xacts_per_job": 1.5, "x": None}},
        "notes": ["a"],
    }
    assert stats.flatten(report) == {
        "throughput.jobs_per_s": 10.0,
        "throughput.costs.xacts_per_job": 1.5,
        "throughput.costs.x": None,
    }


def test_aggregate_takes_median_and_range_per_figure() -> None:
    runs: list[dict[str, Any]] = [
        {"throughput": {"jobs_per_s": 100}, "latency": {"p50": 2.0}},
        {"throughput": {"jobs_per_s": 300}, "latency": {"p50": None}},
        {"throughput": {"jobs_per_s": 200}},
    ]
    assert stats.aggregate(runs) == {
        "latency.p50": {"median": 2.0, "min": 2.0, "max": 2.0},
        "throughput.jobs_per_s": {"median": 200.0, "min": 100.0, "max": 300.0},
    }


def test_runs_rotate_the_order_of_systems() -> None:
    a, b, c = (SYSTEMS[n] for n in ("fleetq", "pgqueuer-default", "procrastinate-c8"))
    assert rotated([a, b, c], 0) == [a, b, c]
    assert rotated([a, b, c], 1) == [b, c, a]
    assert rotated([a, b, c], 2) == [c, a, b]
    assert rotated([a, b, c], 3) == [a, b, c]


def test_select_names_systems_and_refuses_unknown_ones() -> None:
    assert [s.name for s in select("fleetq, pgqueuer-default")] == ["fleetq", "pgqueuer-default"]
    assert [s.name for s in select("all")] == list(SYSTEMS)
    with pytest.raises(Exception, match="unknown system"):
        select("fleetq,rabbit")


def test_rows_with_equal_caps_pair_up() -> None:
    caps: dict[int | None, set[str]] = {}
    for s in SYSTEMS.values():
        caps.setdefault(s.in_flight_per_worker, set()).add(s.kind)
    assert caps[8] == {"fleetq", "pgqueuer", "procrastinate", "floor"}
    assert caps[32] == {"fleetq", "pgqueuer", "floor"}
    assert caps[512] == {"fleetq", "floor"}  # the floor beside fleetq's defaults


def _row(system: System, jobs_per_s: list[float]) -> dict[str, object]:
    runs = [{"throughput": {"jobs_per_s": v}} for v in jobs_per_s]
    return {
        "system": system.name,
        "in_flight_per_worker": system.in_flight_per_worker,
        "batch": system.batch,
        "summary": stats.aggregate(runs),
    }


def test_markdown_shows_medians_with_their_range() -> None:
    report = {
        "runs": 3,
        "cpus": 2,
        "plan": {"workers": 4, "jobs": 5000, "rate": 200.0, "stream_seconds": 10.0},
        "server": {"version_num": 150020},
        "systems": [
            _row(SYSTEMS["fleetq"], [1000, 1200, 1100]),
            _row(SYSTEMS["pgqueuer-default"], [800, 800, 800]),
        ],
    }
    text = markdown(report)
    assert "| fleetq | 512 | 256 | 1,100 (1,000-1,200) |" in text
    assert "| pgqueuer-default | unset | 10 | 800 |" in text
    assert "**Cost per job, steady stream**" in text
    assert "3 run(s)" in text
