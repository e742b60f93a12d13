"""Does a claim stay as cheap under a million finished jobs? Before and after.

A probe, run twice: a few simulated runners drain `--probe-jobs` jobs (each claim's round
trip timed on the runner's side), and, while those jobs are still queued, the claim is
run a few times on a connection with `auto_explain` (ANALYZE, BUFFERS, nested statements)
inside a transaction that is rolled back, so its plans and shared buffers are read
without taking anything. Between the two probes, `--history` finished jobs are written
as the protocol leaves them (job, execution, four events, verdict; see the
`bench_scale_history` block) in batches, then VACUUM ANALYZE. Then `fleetq prune` takes
that history away again (it ended an hour ago and earlier; the probes' jobs stay), timed,
and a third probe shows the claim after the prune.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from datetime import timedelta
from typing import Any

import asyncpg

from fleetq.core import producer, prune, queries
from fleetq.core.driver import AsyncpgDriver, Driver, prepare_asyncpg
from fleetq_bench import figures, harness
from fleetq_bench.simrunner import Serving, SimRunner, start_fleet
from fleetq_bench.sql import SQL

EXPLAINS = 5  # claims explained per probe (the median is reported)
EXPLAIN_LIMIT = 4  # jobs each explained claim would take (a runner's 4 free slots)

# auto_explain in the session, from its first statement: a superuser's startup setting
AUTO_EXPLAIN = {
    "session_preload_libraries": "auto_explain",
    "auto_explain.log_min_duration": "0",
    "auto_explain.log_analyze": "on",
    "auto_explain.log_buffers": "on",
    "auto_explain.log_timing": "off",
    "auto_explain.log_nested_statements": "on",
    "auto_explain.log_format": "json",
    "auto_explain.log_level": "notice",
    "client_min_messages": "notice",
}


async def measure(
    db: str, args: argparse.Namespace, options: dict[str, Any], spec: producer.JobSpec
) -> dict[str, Any]:
    """Probe, write the history, probe again; the report of both. The probes submit
    jobs like `spec`; the history is of that project and operation, on the runners'
    lane (`options`)."""
    observer = await AsyncpgDriver.connect(db)
    try:
        await harness.require_connections(
            observer, args.probe_runners + 3, what="the history probe"
        )
        fleet_ = await start_fleet(db, args.probe_runners, prefix="probe", **options)
        before = await _probe(db, observer, fleet_, args, spec)
        start = time.monotonic()
        written = 0
        while written < args.history:
            last = min(args.history, written + args.history_batch)
            (row,) = await observer.fetch(
                SQL.sql("bench_scale_history"),
                written + 1,
                last,
                fleet_[0].runner,
                spec["project"],
                spec["operation"],
                options["lane"],
                timeout=600,
            )
            written += int(row["jobs"])
        insert_s = time.monotonic() - start
        await observer.fetch(SQL.sql("bench_scale_vacuum"), timeout=1800)
        vacuum_s = time.monotonic() - start - insert_s
        fleet_ = await start_fleet(db, args.probe_runners, prefix="probe", **options)
        after = await _probe(db, observer, fleet_, args, spec)
        # the history ended an hour ago and earlier; the probes' jobs are minutes old
        pruned = await prune.prune(observer, before=timedelta(minutes=30))
        fleet_ = await start_fleet(db, args.probe_runners, prefix="probe", **options)
        after_prune = await _probe(db, observer, fleet_, args, spec)
    finally:
        await observer.close()
    return {
        "finished_jobs_added": written,
        "insert_s": round(insert_s, 1),
        "vacuum_analyze_s": round(vacuum_s, 1),
        "probe_runners": args.probe_runners,
        "probe_jobs": args.probe_jobs,
        "before": before,
        "after": after,
        "prune": {
            "jobs": pruned.removed.jobs,
            "rows": pruned.removed.rows,
            "batches": pruned.batches,
            "seconds": pruned.seconds,
            "jobs_per_s": round(pruned.removed.jobs / pruned.seconds) if pruned.seconds else None,
        },
        "after_prune": after_prune,
    }


async def _probe(
    db: str,
    observer: Driver,
    fleet_: list[SimRunner],
    args: argparse.Namespace,
    spec: producer.JobSpec,
) -> dict[str, Any]:
    (sizes,) = await observer.fetch(SQL.sql("bench_scale_sizes"))
    first = await harness.last_job_id(observer) + 1
    await producer.submit_many(observer, [spec] * args.probe_jobs, submitted_by="bench")
    explained = await explain_claims(db, fleet_[0].runner, fleet_[0].lane)
    async with Serving(fleet_) as serving:
        await harness.wait_until(
            lambda: _drained(observer),
            timeout=args.timeout,
            what="the probe's jobs to drain",
            alive=serving.alive,
        )
        claims = serving.claims()
    (drain,) = await observer.fetch(SQL.sql("bench_scale_drain"), first)
    return {
        "finished_jobs": int(sizes["finished"]),
        "jobs_table_mb": round(int(sizes["jobs_bytes"]) / 2**20, 1),
        "jobs": int(drain["jobs"]),
        "succeeded": int(drain["succeeded"]),
        "claim_ms": figures.summary([s for s, n in claims if n], scale=1000),
        "empty_claim_ms": figures.summary([s for s, n in claims if not n], scale=1000),
        "explain": explained,
    }


async def _drained(observer: Driver) -> bool:
    return not await harness.queue_open(observer)


async def explain_claims(db: str, runner: str, lane: str) -> dict[str, Any] | None:
    """The claim's shared buffers (median of `EXPLAINS` claims, each rolled back): of the
    whole call, and of its candidates query (the index walk over queued jobs), with the
    index that query's plan used. None when the login may not load auto_explain."""
    try:
        conn = await asyncpg.connect(db, timeout=10, server_settings=AUTO_EXPLAIN)
    except asyncpg.PostgresError:
        return None  # session_preload_libraries is a superuser's setting
    plans: list[dict[str, Any]] = []
    conn.add_log_listener(lambda _c, msg: plans.extend(_plans(msg.message)))
    try:
        await prepare_asyncpg(conn)
        totals, candidates, scans = [], [], set()
        for _ in range(EXPLAINS):
            plans.clear()
            tr = conn.transaction()
            await tr.start()
            rows = await conn.fetch(
                queries.sql("lease_claim"), runner, lane, EXPLAIN_LIMIT, uuid.uuid4()
            )
            await tr.rollback()
            await asyncio.sleep(0)  # let the notices' callbacks run
            top = [p for p in plans if "fleetq.claim(" in str(p.get("Query Text", ""))]
            inner = [p for p in plans if "WITH candidates AS" in str(p.get("Query Text", ""))]
            if not rows or not top or not inner:
                return None
            totals.append(figures.explain_buffers(top[-1])["shared_hit"])
            # the first: the walk that chooses the jobs to hold (the second takes them)
            candidates.append(figures.explain_buffers(inner[0])["shared_hit"])
            scans |= _index_names(inner[0])
    finally:
        await conn.close()
    return {
        "claims": EXPLAINS,
        "jobs_per_claim": EXPLAIN_LIMIT,
        "shared_hit": statistics.median(totals),
        "candidates_shared_hit": statistics.median(candidates),
        "candidates_indexes": sorted(scans),
    }


def _plans(message: str) -> list[dict[str, Any]]:
    """The JSON plan of an auto_explain notice ("duration: … ms  plan:\\n{…}")."""
    _, found, text = message.partition("plan:")
    if not found:
        return []
    try:
        plan = json.loads(text)
    except ValueError:
        return []
    return [plan] if isinstance(plan, dict) else []


def _index_names(plan: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    stack = [plan.get("Plan", plan)]
    while stack:
        node = stack.pop()
        if "Index Name" in node:
            found.add(str(node["Index Name"]))
        stack.extend(node.get("Plans", []))
    return found
