"""The scale benchmark: a simulated fleet of 1 to 1,000 runners on the real protocol,
connected directly or through fleetq's gateways (`--via direct,gateways`).

Each simulated runner (`simrunner`) has its own connection and makes the calls a real
runner makes, at its cadence: register, claim (the real `fleetq.claim`, its lane and
slots), report the start, record the outcome with the fencing token, heartbeat, reap,
collect, ping, LISTEN/NOTIFY wake-ups with the runner's backing-off poll. Jobs run no
process, so what is measured is the queue. Phases, each in a scratch database of its
own (created, migrated, dropped):

1. sweep: for each fleet size, a warm-up burst (not counted), then a burst of `--jobs`
   jobs submitted in one bulk submit and drained: jobs/s and claim calls/s over the
   drain (database time, submit to last outcome), and each claim's round trip on the
   runner's side (p50/p95/p99, claims that took jobs and empty ones apart);
2. idle: the largest fleet with nothing queued, after its polls backed off and the
   server's statistics settled: transactions per second on the database
   (pg_stat_database) and transaction ids assigned (server-wide), against what the
   runner's cadence predicts;
3. history (`history`): claim latency and the claim's shared buffers before and after
   `--history` finished jobs are written under the queue.

Run it as `fleetq-bench scale` or `python -m fleetq_bench.scale --dsn DSN`; it prints
a JSON report. Wrap real runs in `flock /tmp/fleetq-bench.lock` on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from fleetq.core import migrate, producer
from fleetq.core.db import resolve_dsn
from fleetq.core.driver import AsyncpgDriver, Driver
from fleetq.runner import config as runner_config
from fleetq_bench import figures, harness, history, scale_plots
from fleetq_bench.gateways import Gateways, runner_tokens
from fleetq_bench.simrunner import Cadence, Serving, SimRunner, runner_id, start_fleet
from fleetq_bench.sql import SQL

LANE, PROJECT, OPERATION = "scale", "scale", "work"
COMMIT = "0" * 40
SPEC: producer.JobSpec = {"project": PROJECT, "operation": OPERATION, "commit": COMMIT}
CONFIG = f"""
[settings]
lease_seconds = 30
runner_offline_after_seconds = 30
[lanes.{LANE}]
[projects.{PROJECT}]
repository = "/dev/null"
[projects.{PROJECT}.operations.{OPERATION}]
lane = "{LANE}"
command = "true"
timeout_seconds = 600
"""
# Beyond the fleet's own: one spare for the scratch database's drop (the benchmark's
# own connection is open when the budget is read, so it counts as in use).
OWN_CONNECTIONS = 1
# A backend flushes its statistics at most once a second while busy and within 10 s of
# going idle (PGSTAT_IDLE_INTERVAL), and idle runners' polls back off 1+2+4+8 s before
# reaching their longest wait: the idle window opens after both.
IDLE_SETTLE_S = 20.0
VIAS = ("direct", "gateways")


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of runner counts: {text!r}") from None
    if not sizes or any(n < 1 for n in sizes):
        raise argparse.ArgumentTypeError("runner counts are positive, e.g. 1,10,25,50,100")
    return sizes


def _vias(text: str) -> list[str]:
    vias = [part.strip() for part in text.split(",") if part.strip()]
    if not vias or any(v not in VIAS for v in vias):
        raise argparse.ArgumentTypeError(f"--via takes {', '.join(VIAS)} (comma separated)")
    return vias


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The scale benchmark's options (defaults: the issue's 1..100 runners x 4 slots)."""
    a = parser.add_argument
    a("--runners", type=_sizes, default=[1, 10, 25, 50, 100], help="fleet sizes, e.g. 1,10,100")
    a("--slots", type=int, default=4, help="slots per simulated runner")
    a("--batch", type=int, default=runner_config.DEFAULT_BATCH, help="claim batch")
    a("--jobs", type=int, default=10_000, help="jobs in each size's measured burst")
    a("--warmup", type=int, default=500, help="uncounted jobs before each burst")
    a("--job-ms", type=float, default=0.0, help="how long each simulated job runs")
    a("--idle-seconds", type=float, default=60.0, help="idle window (0: skip the phase)")
    a("--idle-settle", type=float, default=IDLE_SETTLE_S, help="wait before the idle window")
    a("--history", type=int, default=1_000_000, help="finished jobs to add (0: skip)")
    a("--history-batch", type=int, default=100_000, help="finished jobs per insert")
    a("--probe-jobs", type=int, default=2_000, help="jobs drained before and after history")
    a("--probe-runners", type=int, default=4, help="runners draining the probe")
    a(
        "--no-listen",
        dest="listen",
        action="store_false",
        help="runners do not LISTEN (real ones do): what listening sessions cost the server",
    )
    a(
        "--via",
        type=_vias,
        default=["direct"],
        help="how the runners reach the database, one sweep each: direct (a connection "
        "each), gateways (fleetq-runner --api through --gateways fleetq api processes), or "
        "both: direct,gateways",
    )
    a("--gateways", type=int, default=2, help="fleetq api processes for --via gateways")
    a("--gateway-pool", type=int, default=10, help="each gateway's database connections")
    a(
        "--pgbouncer",
        action="store_true",
        help="the gateways' pools through PgBouncer in transaction mode (Debian's pgbouncer)",
    )
    a("--bouncer-pool", type=int, default=20, help="PgBouncer's server connections")
    a("--plot", metavar="DIR", help="write PNG plots here")
    a("--timeout", type=float, default=900.0, help="give up a phase after this long")


def run(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run every phase against the server of `dsn`; returns the JSON report."""
    if args.plot:
        scale_plots.require()  # before a long run, not after it
    report: dict[str, Any] = {
        "benchmark": "scale",
        "cpus": os.cpu_count(),
        "slots_per_runner": args.slots,
        "batch": args.batch,
        "jobs_per_burst": args.jobs,
        "job_ms": args.job_ms,
        "listen": args.listen,
        "via": args.via,
        "gateways": args.gateways,
        "gateway_pool": args.gateway_pool,
        "pgbouncer": args.pgbouncer,
    }
    with (
        migrate.scratch_database(dsn, "fleetq_bench_scale") as db,
        tempfile.TemporaryDirectory(prefix="fleetq-bench-scale-") as tmp,
    ):
        harness.apply_config(db, CONFIG, Path(tmp))
        report.update(asyncio.run(_sweep_and_idle(db, args)))
    if args.history > 0:
        with (
            migrate.scratch_database(dsn, "fleetq_bench_scale") as db,
            tempfile.TemporaryDirectory(prefix="fleetq-bench-scale-") as tmp,
        ):
            harness.apply_config(db, CONFIG, Path(tmp))
            report["history"] = asyncio.run(history.measure(db, args, fleet_options(args), SPEC))
    if args.plot:
        report["plots"] = [str(p) for p in scale_plots.write(report, Path(args.plot))]
    return report


def fleet_options(args: argparse.Namespace) -> dict[str, Any]:
    """How every simulated runner of this run is set up."""
    return {
        "lane": LANE,
        "slots": args.slots,
        "batch": args.batch,
        "job_s": args.job_ms / 1000,
        "listen": args.listen,
    }


async def _sweep_and_idle(db: str, args: argparse.Namespace) -> dict[str, Any]:
    observer = await AsyncpgDriver.connect(db)
    steps: list[dict[str, Any]] = []
    idles: list[dict[str, Any]] = []
    try:
        server = await harness.require_connections(observer, OWN_CONNECTIONS, what="the run")
        for via in args.via:
            with contextlib.ExitStack() as stack:
                gateways = None
                if via == "gateways":
                    gateways = stack.enter_context(
                        Gateways(
                            db,
                            count=args.gateways,
                            pool_size=args.gateway_pool,
                            pgbouncer=args.pgbouncer,
                            bouncer_pool=args.bouncer_pool,
                        )
                    )
                for n in args.runners:
                    if gateways is None and (stop := await _direct_stops(observer, n, args)):
                        steps.append({"runners": n, "via": via, "stopped": stop})
                        continue
                    steps.append(await _step(db, observer, n, args, gateways))
                if args.idle_seconds:
                    n = max(args.runners)
                    if gateways is None and await _direct_stops(observer, n, args):
                        continue
                    idles.append(await _idle(db, observer, n, args, gateways))
    finally:
        await observer.close()
    return {
        "server": server,
        "cadence": _cadence_report(),
        "steps": steps,
        "idle": idles[0] if idles else None,
        "idles": idles,
    }


async def _direct_stops(observer: Driver, n: int, args: argparse.Namespace) -> str | None:
    """Why `n` direct runners cannot run here (a connection each is more than the server
    has free), when gateways are measured too; alone, direct asks for the room it needs."""
    try:
        await harness.require_connections(observer, n + OWN_CONNECTIONS, what=f"{n} direct runners")
    except harness.BenchError as exc:
        if args.via == ["direct"]:
            raise
        return str(exc)
    return None


async def _fleet(
    db: str, n: int, prefix: str, args: argparse.Namespace, gateways: Gateways | None
) -> list[SimRunner]:
    apis = None
    if gateways is not None:
        ids = [runner_id(prefix, i) for i in range(n)]
        apis = gateways.apis(await asyncio.to_thread(runner_tokens, db, ids))
    return await start_fleet(db, n, prefix=prefix, apis=apis, **fleet_options(args))


def _cadence_report() -> dict[str, float]:
    c = Cadence()
    return {
        "poll_s": c.poll_s,
        "poll_max_s": c.poll_max_s,
        "reap_s": c.reap_s,
        "ping_s": c.ping_s,
        "beat_s": c.beat_s(30, 30),
        "schedules_s": c.schedules_s,
    }


async def _burst(
    observer: Driver,
    jobs: int,
    timeout: float,
    serving: Serving,
    waits: Counter[str],
    sessions: list[int] | None = None,
) -> int:
    """Submit `jobs` in one bulk submit and wait until none is open, sampling what the
    database's sessions wait on meanwhile into `waits`; returns the burst's first job id."""
    first = await harness.last_job_id(observer) + 1
    await producer.submit_many(observer, [SPEC] * jobs, submitted_by="bench")

    async def drained() -> bool:
        waits["samples"] += 1
        for row in await observer.fetch(SQL.sql("bench_scale_waits")):
            waits[str(row["wait"])] += int(row["n"])
        if sessions is not None:
            (row,) = await observer.fetch(SQL.sql("bench_scale_sessions"))
            sessions.append(int(row["n"]))
        return not await harness.queue_open(observer)

    await harness.wait_until(
        drained, timeout=timeout, what=f"a burst of {jobs} jobs to drain", alive=serving.alive
    )
    return first


def wait_report(waits: Counter[str], top: int = 6) -> dict[str, Any]:
    """Sampled sessions per wait: on average, how many of the database's sessions were
    busy, and how many of them waited on each of the `top` waits ('CPU': running)."""
    samples = waits["samples"]
    counts = {k: v for k, v in waits.items() if k != "samples"}
    if not samples:
        return {"samples": 0, "active_sessions": None, "waits": {}}
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return {
        "samples": samples,
        "active_sessions": round(sum(counts.values()) / samples, 2),
        "waits": {k: round(v / samples, 2) for k, v in ranked},
    }


async def _step(
    db: str, observer: Driver, n: int, args: argparse.Namespace, gateways: Gateways | None
) -> dict[str, Any]:
    fleet_ = await _fleet(db, n, f"sim{n}{'g' if gateways else 'x'}", args, gateways)
    async with Serving(fleet_) as serving:
        if args.warmup:
            await _burst(observer, args.warmup, args.timeout, serving, Counter())
        serving.reset()
        waits: Counter[str] = Counter()
        sessions: list[int] = []
        cpu, wall = time.process_time(), time.perf_counter()
        first = await _burst(observer, args.jobs, args.timeout, serving, waits, sessions)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        claims, refills = serving.claims(), serving.refills()
        stale, races = serving.stale()
        retried = serving.retried()
    (row,) = await observer.fetch(SQL.sql("bench_scale_drain"), first)
    return {
        "via": "gateways" if gateways else "direct",
        **step_report(
            runners=n,
            slots=args.slots,
            drain=row,
            claims=claims,
            refills=refills,
            harness_cpu_s=cpu,
            harness_wall_s=wall,
            stale=stale,
            self_races=races,
        ),
        "calls_sent_again": retried,
        "server_connections": {
            "max": max(sessions, default=0),
            "mean": round(sum(sessions) / len(sessions), 1) if sessions else None,
        },
        "database": wait_report(waits),
    }


def step_report(
    *,
    runners: int,
    slots: int,
    drain: dict[str, Any],
    claims: list[tuple[float, int]],
    harness_cpu_s: float,
    harness_wall_s: float,
    stale: int,
    self_races: int = 0,
    refills: list[tuple[float, int]] | None = None,
) -> dict[str, Any]:
    """One fleet size's figures: rates over the drain in database time (first submit to
    last outcome), claim round trips from the runners' side."""
    drain_s = float(drain["drain_s"] or 0)
    refills = refills or []
    taking = [s for s, jobs in claims if jobs]
    empty = [s for s, jobs in claims if not jobs]
    return {
        "runners": runners,
        "slots": runners * slots,
        "jobs": int(drain["jobs"]),
        "succeeded": int(drain["succeeded"]),
        "drain_s": round(drain_s, 3),
        "jobs_per_s": figures.per_second(int(drain["jobs"]), drain_s),
        "claim_calls": len(claims),
        "claim_calls_per_s": figures.per_second(len(claims), drain_s),
        "jobs_per_claim": round(sum(j for _, j in claims) / len(taking), 2) if taking else None,
        "claim_ms": figures.summary(taking, scale=1000),
        "empty_claim_ms": figures.summary(empty, scale=1000),
        # outcome batches that carried the claim for the room they freed (the runner's
        # refill): outcomes and claim in one round trip, timed together
        "refill_calls": len(refills),
        "refill_jobs": sum(j for _, j in refills),
        "refill_ms": figures.summary([s for s, _ in refills], scale=1000),
        # one Python process plays the whole fleet: near 100% means the harness, not the
        # database, may be what limits the rate
        "harness_cpu_percent": round(100 * harness_cpu_s / harness_wall_s, 1)
        if harness_wall_s > 0
        else None,
        "stale_writes": stale,
        "heartbeat_self_races": self_races,
    }


async def _idle(
    db: str, observer: Driver, n: int, args: argparse.Namespace, gateways: Gateways | None
) -> dict[str, Any]:
    fleet_ = await _fleet(db, n, f"idle{'g' if gateways else 'x'}", args, gateways)
    async with Serving(fleet_) as serving:
        await asyncio.sleep(args.idle_settle)  # see IDLE_SETTLE_S; not a synchronisation
        serving.alive()
        (tx0,) = await observer.fetch(SQL.sql("bench_transactions"))
        (xid0,) = await observer.fetch(SQL.sql("bench_scale_xids"))
        start = time.monotonic()
        await asyncio.sleep(args.idle_seconds)  # the window being measured
        (tx1,) = await observer.fetch(SQL.sql("bench_transactions"))
        (xid1,) = await observer.fetch(SQL.sql("bench_scale_xids"))
        (sessions,) = await observer.fetch(SQL.sql("bench_scale_sessions"))
        seconds = time.monotonic() - start
        serving.alive()
    c = Cadence()
    return {
        "via": "gateways" if gateways else "direct",
        **idle_report(
            runners=n,
            seconds=seconds,
            # own: the window's reads of the counters (the second's may be flushed or not)
            transactions=figures.counter_delta(int(tx0["n"]), int(tx1["n"]), own=2),
            xids=figures.counter_delta(int(xid0["next_xid"]), int(xid1["next_xid"])),
            expected_per_runner_s=figures.idle_cadence(
                beat_s=c.beat_s(30, 30),
                reap_s=c.reap_s,
                ping_s=c.ping_s,
                poll_max_s=c.poll_max_s,
                collect_s=30,
                schedules_s=c.schedules_s,
            ),
        ),
        "server_connections": int(sessions["n"]),
    }


def idle_report(
    *, runners: int, seconds: float, transactions: int, xids: int, expected_per_runner_s: float
) -> dict[str, Any]:
    """The idle fleet's load: transactions on its database (per second, and per runner
    and second) and transaction ids assigned on the whole server (writes: the heartbeats
    and whatever else runs on that server meanwhile)."""
    return {
        "runners": runners,
        "seconds": round(seconds, 1),
        "transactions_per_s": figures.per_second(transactions, seconds),
        # to thousandths: the target is 0.1 per runner, which tenths would round onto
        "transactions_per_runner_s": round(transactions / runners / seconds, 3)
        if seconds > 0
        else None,
        "expected_per_runner_s": round(expected_per_runner_s, 2),
        "xids_per_s": figures.per_second(xids, seconds),
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m fleetq_bench.scale`: run and print the JSON report."""
    parser = argparse.ArgumentParser(prog="python -m fleetq_bench.scale", description=__doc__)
    parser.add_argument("--dsn", help="PostgreSQL server (default: $FLEETQ_DSN, else embedded)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    report = run(resolve_dsn(args.dsn), args)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
