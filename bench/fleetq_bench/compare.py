"""`fleetq-bench --compare`: every selected system, the same workload, several runs.

Runs interleave (run 1 measures A, B, C; run 2 B, C, A; ...), so a slow drift of the
machine (another tenant, a warming cache, autovacuum) spreads over all systems instead
of landing on whichever ran last. Each system is summarised by the median and the range
of every figure over its runs; the raw runs stay in the report.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

from fleetq.core.db import connect
from fleetq_bench import stats
from fleetq_bench.counters import SQL
from fleetq_bench.peers import System, load
from fleetq_bench.phases import Plan, measure

PACKAGES = ("fleetq", "pgqueuer", "procrastinate", "asyncpg", "psycopg")


def rotated(systems: Sequence[System], run: int) -> list[System]:
    """The order of run `run` (0-based): the list turned by one place per run."""
    k = run % len(systems) if systems else 0
    return [*systems[k:], *systems[:k]]


def compare(
    server_dsn: str,
    systems: Sequence[System],
    plan: Plan,
    runs: int,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Measure `systems` `runs` times each, interleaved; the whole report."""
    for system in systems:
        load(system)  # every library importable before the first run, not after an hour
    results: dict[str, list[dict[str, Any]]] = {s.name: [] for s in systems}
    for run in range(runs):
        for system in rotated(systems, run):
            progress(f"run {run + 1}/{runs}: {system.name}")
            results[system.name].append(measure(system, server_dsn, plan))
    return {
        "generated_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "plan": dataclasses.asdict(plan),
        "runs": runs,
        "cpus": os.cpu_count(),
        "server": server_settings(server_dsn),
        "versions": versions(),
        "systems": [summary(s, results[s.name]) for s in systems],
    }


def summary(system: System, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One system's row: what it is, each figure's median and range, and every run."""
    return {
        "system": system.name,
        "kind": system.kind,
        "in_flight_per_worker": system.in_flight_per_worker,
        "batch": system.batch,
        "settings": system.settings,
        "summary": stats.aggregate(runs),
        "runs": runs,
    }


def server_settings(server_dsn: str) -> dict[str, Any]:
    """The server's version and the settings that move the figures most."""
    with connect(server_dsn, autocommit=True) as conn:
        row = conn.execute(SQL.sql("counters_server_settings").encode()).fetchone()
    assert row is not None
    return dict(
        zip(
            (
                "version",
                "version_num",
                "synchronous_commit",
                "fsync",
                "shared_buffers",
                "max_connections",
            ),
            row,
            strict=True,
        )
    )


def versions() -> dict[str, str | None]:
    """The installed version of each package measured or measuring."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


# The docs' tables: (heading, dotted path of the figure, decimals).
MAIN_COLUMNS = (
    ("jobs/s, first start → last outcome", "throughput.jobs_per_s", 0),
    ("jobs/s, enqueue → drained", "throughput.drain_jobs_per_s", 0),
    ("bulk enqueue s", "throughput.enqueue_seconds", 3),
    ("latency p50 ms", "latency.enqueue_to_start_ms.p50", 1),
    ("p95 ms", "latency.enqueue_to_start_ms.p95", 1),
    ("p99 ms", "latency.enqueue_to_start_ms.p99", 1),
)
COST_COLUMNS = (
    ("write xacts", "write_xacts_per_job", 2),
    ("statements", "statements_per_job", 2),
    ("xacts", "xacts_per_job", 2),
    ("rows inserted", "rows_inserted_per_job", 2),
    ("WAL bytes", "wal_bytes_per_job", 0),
    ("worker CPU ms", "worker_cpu_ms_per_job", 3),
    ("server CPU ms", "server_cpu_ms_per_job", 3),
)


def markdown(report: dict[str, Any]) -> str:
    """The tables docs/performance.md shows: medians, with the range when runs > 1."""
    rows = report["systems"]
    parts = [
        _table(
            "Throughput and latency",
            [("system", None, 0), ("in flight/worker", None, 0), ("batch", None, 0)],
            MAIN_COLUMNS,
            rows,
        )
    ]
    for phase, title in (("throughput", "throughput phase"), ("latency", "steady stream")):
        cols = tuple((h, f"{phase}.costs.{p}", d) for h, p, d in COST_COLUMNS)
        parts.append(_table(f"Cost per job, {title}", [("system", None, 0)], cols, rows))
    plan = report["plan"]
    parts.append(
        f"{report['runs']} run(s), median (min-max); {plan['workers']} worker processes "
        f"per system; {plan['jobs']} jobs in the throughput phase; "
        f"{plan['rate']:g} jobs/s for {plan['stream_seconds']:g} s in the stream; "
        f"PostgreSQL {report['server']['version_num']}, {report['cpus']} CPUs."
    )
    return "\n\n".join(parts) + "\n"


def _table(
    title: str,
    head: list[tuple[str, str | None, int]],
    columns: Sequence[tuple[str, str, int]],
    rows: list[dict[str, Any]],
) -> str:
    headings = [h for h, _, _ in head] + [h for h, _, _ in columns]
    lines = [
        f"**{title}**",
        "",
        "| " + " | ".join(headings) + " |",
        "|" + "|".join("---" for _ in headings) + "|",
    ]
    for row in rows:
        cells = [row["system"], str(row["in_flight_per_worker"] or "unset"), str(row["batch"])]
        cells = cells[: len(head)]
        cells += [_cell(row["summary"].get(path), d) for _, path, d in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(figure: dict[str, float | None] | None, decimals: int) -> str:
    if figure is None or figure["median"] is None:
        return "-"
    med, low, high = figure["median"], figure["min"], figure["max"]
    text = f"{med:,.{decimals}f}"
    if low is not None and high is not None and low != high:
        text += f" ({low:,.{decimals}f}-{high:,.{decimals}f})"
    return text
