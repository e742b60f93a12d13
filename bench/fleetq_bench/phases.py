"""One system measured once: the phases every row of `fleetq-bench` goes through.

In a scratch database of its own, with W worker processes started before any clock runs:

1. calibration (workers not started yet): the producer's bulk enqueue and single submit
   are timed against the counters, so what the harness itself costs the database is
   known and taken off; the warm-up's jobs are that bulk enqueue;
2. warm-up (uncounted): the workers drain it, so connections have prepared their
   statements and warmed their caches;
3. idle: `settle` seconds for the statistics to flush, then the idle workers' rate of
   transactions over `idle` seconds (taken off the settle tails below);
4. throughput: N jobs in one bulk enqueue while the workers wait, drained; jobs/s two
   ways: first start -> last outcome in the system's own tables, and from the enqueue's
   return (its commit) to the harness seeing the queue empty;
5. stream: J jobs/s submitted one by one for S seconds; enqueue -> start on the
   producer's clock; costs per job of this phase on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from fleetq.core import migrate
from fleetq.core.driver import PsycopgDriver
from fleetq.core.errors import FleetqError
from fleetq_bench import stats
from fleetq_bench.counters import READ, SQL, Cost, Counters, IdleRate, Snapshot, find_server
from fleetq_bench.counters import per_job as costs
from fleetq_bench.peers import Peer, System, load

POLL_S = 0.02  # the harness's drain poll: fine enough for a drain of a second or two


@dataclasses.dataclass(frozen=True)
class Plan:
    """The workload: the same for every system of a comparison."""

    jobs: int = 5000
    workers: int = 4
    warmup: int = 1000
    rate: float = 200.0
    stream_seconds: float = 10.0
    settle: float = 11.0  # > PGSTAT_IDLE_INTERVAL (10 s): every backend has flushed
    idle: float = 5.0
    timeout: float = 300.0


def measure(system: System, server_dsn: str, plan: Plan) -> dict[str, Any]:
    """Measure `system` once, in a scratch database dropped afterwards."""
    peer = load(system)
    with (
        migrate.scratch_database(server_dsn, f"fleetq_bench_{system.kind}", migrated=False) as dsn,
        tempfile.TemporaryDirectory(prefix="fleetq-bench-") as tmp,
    ):
        return asyncio.run(_measure(peer, dsn, plan, Path(tmp)))


async def _measure(peer: Peer, dsn: str, plan: Plan, work: Path) -> dict[str, Any]:
    await peer.install(dsn, work)
    counters, notes = await open_counters(dsn)
    await peer.open(dsn)
    try:
        calls = await _calibrate(peer, counters, plan)
        with _workers(peer, dsn, plan.workers, work) as procs:
            counters.workers = [psutil.Process(p.pid) for p in procs]
            run = _Run(peer, counters, plan, work, procs, calls)
            report = await run.phases()
    finally:
        await peer.close()
        await counters.driver.close()
    report["notes"] = notes
    return _describe(peer.system, plan) | report


async def open_counters(dsn: str) -> tuple[Counters, list[str]]:
    """The counters' connection on the scratch database, and what they cannot count."""
    driver = await PsycopgDriver.connect(dsn)
    notes: list[str] = []
    (row,) = await driver.fetch(SQL.sql("counters_preloaded"))
    statements = bool(row["preloaded"])
    if statements:
        await driver.fetch(SQL.sql("counters_create_extension"))
    else:
        notes.append(
            "statements_per_job is null: pg_stat_statements is not in the server's "
            "shared_preload_libraries"
        )
    try:
        await driver.fetch(SQL.sql("counters_create_walinspect"))
        await driver.fetch(SQL.sql("counters_reserve_wal"))
        walinspect = True
    except FleetqError as exc:
        walinspect = False
        notes.append(
            "write_xacts_per_job and wal_bytes_per_job are the whole server's (transaction "
            f"ids, WAL position): pg_walinspect cannot be used here ({exc})"
        )
    (server,) = await driver.fetch(SQL.sql("counters_server"))
    postmaster, why = find_server(int(server["backend_pid"]), float(server["started"]))
    if why:
        notes.append(f"server CPU figures are null: {why}")
    counters = Counters(driver, statements=statements, walinspect=walinspect, server=postmaster)
    counters.notes = notes
    return counters, notes


@dataclasses.dataclass(frozen=True)
class HarnessCalls:
    """What the producer's calls cost, measured while no worker runs."""

    bulk: Cost
    submit: Cost

    def report(self) -> dict[str, Any]:
        """As the report shows it."""
        return {
            "bulk_enqueue": dataclasses.asdict(self.bulk),
            "submit": dataclasses.asdict(self.submit),
        }


async def _calibrate(peer: Peer, counters: Counters, plan: Plan) -> HarnessCalls:
    """Measure the producer's calls (after one of each, which may prepare statements or
    look types up once per connection). The minimum of three submits stands, as the
    transaction ids are the whole server's."""
    await peer.enqueue(1)
    await peer.submit(time.time())
    a = await counters.read()
    await peer.enqueue(plan.warmup)
    bulk = await _call_cost(counters, a, await counters.read())
    submits = []
    for _ in range(3):
        c = await counters.read()
        await peer.submit(time.time())
        submits.append(await _call_cost(counters, c, await counters.read()))
    submit = min(submits, key=lambda c: (c.write_xacts, c.statements))
    return HarnessCalls(bulk, submit)


async def _call_cost(counters: Counters, a: Snapshot, b: Snapshot) -> Cost:
    """One producer call between snapshots `a` and `b` (their own reads taken off)."""
    own = b.own.statements - a.own.statements
    if a.statements is None or b.statements is None:
        statements = 1
    else:
        statements = b.statements - a.statements - own
    wal = await counters.wal(a, b)
    return Cost(statements=statements, xacts=1, write_xacts=wal.write_xacts)


class _Run:
    """The phases after calibration, with the workers up."""

    def __init__(
        self,
        peer: Peer,
        counters: Counters,
        plan: Plan,
        work: Path,
        procs: list[subprocess.Popen[bytes]],
        calls: HarnessCalls,
    ) -> None:
        self.peer, self.counters, self.plan, self.work = peer, counters, plan, work
        self.procs, self.calls = procs, calls

    async def phases(self) -> dict[str, Any]:
        """Warm-up, idle, throughput, stream, in order."""
        await self._until(lambda: self.peer.ready(self.plan.workers, self.work), "the workers")
        await self._until(self.peer.drained, "the warm-up to drain")
        idle, rate, before = await self._idle()
        throughput, first, settled = await self._throughput(before, rate)
        latency, stream_first, since = await self._stream(settled, rate)
        span = await self.peer.span(first, stream_first)
        samples = await self.peer.latencies(stream_first, since, self.work)
        throughput |= _span_figures(span)
        latency["jobs"] = len(samples.producer_ms)
        latency["enqueue_to_start_ms"] = stats.percentiles(samples.producer_ms)
        latency["database_created_to_claimed_ms"] = (
            None if samples.database_ms is None else stats.percentiles(samples.database_ms)
        )
        return {
            "harness_calls": self.calls.report(),
            "idle": idle,
            "throughput": throughput,
            "latency": latency,
        }

    async def _idle(self) -> tuple[dict[str, Any] | None, IdleRate, Snapshot]:
        await _pause(self.plan.settle)
        a = await self.counters.read()
        if self.plan.idle <= 0:
            return None, IdleRate(0.0), a
        await _pause(self.plan.idle)
        b = await self.counters.read()
        rate = IdleRate.between(a, b)
        wal = await self.counters.wal(a, b)
        per_worker_s = self.plan.workers * (b.at - a.at)
        idle = {
            "seconds": round(b.at - a.at, 1),
            "xacts_per_worker_s": round(rate.xacts_per_s / self.plan.workers, 2),
            "write_xacts_per_worker_s": round(wal.write_xacts / per_worker_s, 2),
            "statements_per_worker_s": None
            if a.statements is None or b.statements is None
            else round(
                (b.statements - a.statements - (b.own.statements - a.own.statements))
                / per_worker_s,
                2,
            ),
        }
        return idle, rate, b

    async def _throughput(
        self, before: Snapshot, rate: IdleRate
    ) -> tuple[dict[str, Any], int, Snapshot]:
        t0 = time.monotonic()
        first = await self.peer.enqueue(self.plan.jobs)
        committed = time.monotonic()
        self.counters.ledger.spend(self.calls.bulk)
        await self._until(self.peer.drained, "the throughput phase to drain", book=True)
        drained = await self.counters.read()
        wal = await self.counters.wal(before, drained)
        await _pause(self.plan.settle)
        settled = await self.counters.read()
        enqueue_s, drain_s = committed - t0, drained.at - committed
        return (
            {
                "enqueue_seconds": round(enqueue_s, 3),
                "enqueue_jobs_per_s": _rate(self.plan.jobs, enqueue_s),
                "drain_seconds": round(drain_s, 3),
                "drain_jobs_per_s": _rate(self.plan.jobs, drain_s),
                "costs": costs(before, drained, settled, self.plan.jobs, rate, wal),
            },
            first,
            settled,
        )

    async def _stream(self, before: Snapshot, rate: IdleRate) -> tuple[dict[str, Any], int, float]:
        total = max(1, int(self.plan.rate * self.plan.stream_seconds))
        since = time.time()
        start = time.monotonic()
        first: int | None = None
        for i in range(total):
            delay = start + i / self.plan.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing the producer, not synchronising
            job = await self.peer.submit(time.time())
            self.counters.ledger.spend(self.calls.submit)
            first = job if first is None else min(first, job)
        sent_s = time.monotonic() - start
        await self._until(self.peer.drained, "the stream to drain", book=True)
        drained = await self.counters.read()
        wal = await self.counters.wal(before, drained)
        await _pause(self.plan.settle)
        settled = await self.counters.read()
        assert first is not None
        return (
            {
                "rate_per_s": self.plan.rate,
                "submitted": total,
                "submit_seconds": round(sent_s, 3),
                "costs": costs(before, drained, settled, total, rate, wal),
            },
            first,
            since,
        )

    async def _until(
        self, check: Callable[[], Awaitable[bool]], what: str, *, book: bool = False
    ) -> None:
        """Poll `check` until true, within the plan's timeout (`book`: each poll is the
        harness's own statement, inside a measured window)."""
        end = time.monotonic() + self.plan.timeout
        while time.monotonic() < end:
            done = await check()
            if book:
                self.counters.ledger.spend(READ)
            if done:
                return
            _check_alive(self.procs, self.work, what)
            await asyncio.sleep(POLL_S)  # polling a condition with a deadline
        raise FleetqError(f"bench: timed out waiting for {what}")


async def _pause(seconds: float) -> None:
    """A measured interval (the statistics' flush, an idle window): not a synchronisation."""
    if seconds > 0:
        await asyncio.sleep(seconds)


def _span_figures(span: Any) -> dict[str, Any]:
    return {
        "jobs": span.jobs,
        "succeeded": span.succeeded,
        "seconds": None if span.seconds is None else round(span.seconds, 3),
        "jobs_per_s": _rate(span.jobs, span.seconds),
    }


def _rate(jobs: int, seconds: float | None) -> float | None:
    return round(jobs / seconds) if seconds else None


def _describe(system: System, plan: Plan) -> dict[str, Any]:
    return {
        "system": system.name,
        "kind": system.kind,
        "workers": plan.workers,
        "in_flight_per_worker": system.in_flight_per_worker,
        "batch": system.batch,
        "settings": system.settings,
    }


@contextlib.contextmanager
def _workers(
    peer: Peer, dsn: str, count: int, work: Path
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start the worker processes; stop them (SIGTERM, then SIGKILL) however it ends."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(count):
            with (work / f"worker-{i}.log").open("wb") as log:
                procs.append(
                    subprocess.Popen(
                        peer.worker_argv(dsn, i, work), stdout=subprocess.DEVNULL, stderr=log
                    )
                )
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _check_alive(procs: list[subprocess.Popen[bytes]], work: Path, what: str) -> None:
    for i, proc in enumerate(procs):
        if proc.poll() is not None:
            tail = (work / f"worker-{i}.log").read_text(errors="replace")[-2000:]
            raise FleetqError(
                f"bench: worker {i} exited ({proc.returncode}) while waiting for {what}; "
                f"its log ends:\n{tail}"
            )
