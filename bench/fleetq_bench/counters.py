"""Server-side counters: what a job costs the database and the machine, per job.

A snapshot reads, in one statement on the scratch database, the WAL position, the next
transaction id, the transactions PostgreSQL's cumulative statistics count on the
database, the top-level calls pg_stat_statements counts there and the backends connected
to it; and, from /proc, the CPU time of the workers, of those backends, and of the whole
PostgreSQL server (the postmaster, the children it reaped, the children alive).

The server may be shared (other databases, other people's benchmarks), so the figures
are this database's wherever PostgreSQL can tell them apart: write transactions and WAL
bytes come from the WAL itself (`Wal`: the records that touched the database's
relations, read with pg_walinspect) rather than from the server-wide transaction id and
WAL position, which are the fallback when pg_walinspect cannot be used; server CPU is the
database's backends', with the whole server's beside it.

Two kinds of counter, two reading times:

- *instant* ones (ids, WAL, statements, CPU) change as work happens: a phase's window
  closes when the harness sees the queue drained;
- *transactions* come from statistics each backend flushes on its own schedule (within
  1 s while busy, up to 10 s once idle; pg_stat_force_next_flush only flushes the
  caller's own), so that window closes only after `settle` seconds, and the idle
  workers' transactions in that tail are subtracted at the rate measured while idle
  just before (`IdleRate`).

The harness's own work on the scratch database (its submits, its drain polls, these
reads) is kept in a `Ledger` and taken off every count it can be told apart in.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import psutil

from fleetq.core.driver import Driver
from fleetq.core.errors import FleetqError
from fleetq_bench.sql import SQL

__all__ = ["SQL"]  # its blocks, for the modules that read counters


@dataclasses.dataclass(frozen=True)
class Cost:
    """What one harness call costs on the scratch database."""

    statements: int = 1
    xacts: int = 1
    write_xacts: int = 0


READ = Cost()  # a counter read or a drain poll: one read-only statement


@dataclasses.dataclass
class Ledger:
    """The harness's own statements and transactions on the scratch database so far."""

    statements: int = 0
    xacts: int = 0
    write_xacts: int = 0

    def spend(self, cost: Cost, times: int = 1) -> None:
        """Book `times` calls of `cost`."""
        self.statements += cost.statements * times
        self.xacts += cost.xacts * times
        self.write_xacts += cost.write_xacts * times

    def copy(self) -> Ledger:
        """This ledger as it stands now."""
        return dataclasses.replace(self)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Every counter at one moment (`at`: the harness's monotonic clock)."""

    at: float
    next_xid: int
    lsn: str
    wal_bytes: int
    xacts: int
    rollbacks: int
    rows_inserted: int
    foreign_xacts: int
    statements: int | None
    evictions: int | None
    server_cpu_s: float | None
    backends_cpu_s: dict[int, float]
    workers_cpu_s: float
    harness_cpu_s: float
    own: Ledger


@dataclasses.dataclass(frozen=True)
class IdleRate:
    """Transactions per second on the scratch database while the workers wait."""

    xacts_per_s: float

    @classmethod
    def between(cls, a: Snapshot, b: Snapshot) -> IdleRate:
        """The rate from two snapshots taken while idle (the harness's own taken off);
        a pending flush at either end is about the same in a steady state, so it
        cancels."""
        seconds = b.at - a.at
        spent = b.xacts - a.xacts - (b.own.xacts - a.own.xacts)
        return cls(max(0.0, spent / seconds) if seconds > 0 else 0.0)


@dataclasses.dataclass(frozen=True)
class Wal:
    """This database's share of the WAL between two snapshots."""

    write_xacts: int
    wal_bytes: int


def server_wide(a: Snapshot, b: Snapshot) -> Wal:
    """The fallback `Wal`: every transaction id and WAL byte of the server."""
    return Wal(b.next_xid - a.next_xid, b.wal_bytes - a.wal_bytes)


def per_job(
    before: Snapshot,
    drained: Snapshot,
    settled: Snapshot,
    jobs: int,
    idle: IdleRate,
    wal: Wal,
) -> dict[str, Any]:
    """The window's costs per job: instant counters (and `wal`) from `before` to
    `drained`, transactions from `before` to `settled` less the idle tail after
    `drained`; the harness's own statements and transactions taken off."""
    if jobs <= 0:
        raise ValueError("costs per job need at least one job")
    own_statements = drained.own.statements - before.own.statements
    tail = idle.xacts_per_s * (settled.at - drained.at)
    xacts = settled.xacts - before.xacts - (settled.own.xacts - before.own.xacts) - tail
    statements = (
        None
        if before.statements is None or drained.statements is None
        else drained.statements - before.statements - own_statements
    )
    return {
        "jobs": jobs,
        "write_xacts_per_job": _per(
            wal.write_xacts - (drained.own.write_xacts - before.own.write_xacts), jobs
        ),
        "statements_per_job": None if statements is None else _per(statements, jobs),
        "statements_evictions": None
        if before.evictions is None or drained.evictions is None
        else drained.evictions - before.evictions,
        "xacts_per_job": _per(xacts, jobs),
        # of those, rolled back: a statement that failed (pg_stat_statements counts
        # only statements that completed)
        "rollbacks_per_job": _per(settled.rollbacks - before.rollbacks, jobs),
        # rows inserted, the harness's submits included (a job row each): a verdict's
        # provenance is to cost no row more in steady state (issue 47)
        "rows_inserted_per_job": _per(settled.rows_inserted - before.rows_inserted, jobs),
        "wal_bytes_per_job": round(wal.wal_bytes / jobs),
        "worker_cpu_ms_per_job": _ms(drained.workers_cpu_s - before.workers_cpu_s, jobs),
        "server_cpu_ms_per_job": _ms(backends_cpu(before, drained), jobs),
        "server_total_cpu_ms_per_job": _ms(_delta(before.server_cpu_s, drained.server_cpu_s), jobs),
        "harness_cpu_ms_per_job": _ms(drained.harness_cpu_s - before.harness_cpu_s, jobs),
        "foreign_xacts": settled.foreign_xacts - before.foreign_xacts,
    }


def backends_cpu(a: Snapshot, b: Snapshot) -> float | None:
    """CPU seconds the database's backends spent from `a` to `b`: a backend that
    connected in between counts whole, one that left is lost (the workers and the
    harness hold their connections for the whole run). None: not readable."""
    if not b.backends_cpu_s and not a.backends_cpu_s:
        return None
    return sum(cpu - a.backends_cpu_s.get(pid, 0.0) for pid, cpu in b.backends_cpu_s.items())


def _per(value: float, jobs: int) -> float:
    return round(value / jobs, 3)


def _ms(seconds: float | None, jobs: int) -> float | None:
    return None if seconds is None else round(seconds * 1000 / jobs, 4)


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


class Counters:
    """Reads snapshots on one connection to the scratch database."""

    def __init__(
        self,
        driver: Driver,
        *,
        statements: bool,
        walinspect: bool,
        server: psutil.Process | None,
    ) -> None:
        self.driver = driver
        self.statements = statements
        self.walinspect = walinspect
        self.server = server
        self.workers: list[psutil.Process] = []
        self.ledger = Ledger()
        self.notes: list[str] = []  # what could not be counted as intended, and why

    async def read(self) -> Snapshot:
        """One snapshot; its own statement is booked after it, where the next snapshot's
        statement statistics will find it."""
        own = self.ledger.copy()
        query = "counters_read" if self.statements else "counters_read_unstated"
        (row,) = await self.driver.fetch(SQL.sql(query))
        self.ledger.spend(READ)
        return Snapshot(
            at=time.monotonic(),
            next_xid=int(row["next_xid"]),
            lsn=str(row["lsn"]),
            wal_bytes=int(row["wal_bytes"]),
            xacts=int(row["xacts"]),
            rollbacks=int(row["rollbacks"]),
            rows_inserted=int(row["rows_inserted"]),
            foreign_xacts=int(row["foreign_xacts"]),
            statements=None if row["statements"] is None else int(row["statements"]),
            evictions=None if row["evictions"] is None else int(row["evictions"]),
            server_cpu_s=server_cpu(self.server),
            backends_cpu_s=self._backends(row["pids"]),
            workers_cpu_s=tree_cpu(self.workers),
            harness_cpu_s=_own_cpu(psutil.Process()),
            own=own,
        )

    async def wal(self, a: Snapshot, b: Snapshot) -> Wal:
        """This database's WAL from `a` to `b` (one statement of the harness's own), or
        the server's whole when pg_walinspect is not there."""
        if not self.walinspect:
            return server_wide(a, b)
        if a.lsn == b.lsn:
            return Wal(0, 0)  # nothing written (and pg_walinspect refuses an empty range)
        try:
            await self._flushed(b.lsn)
            (row,) = await self.driver.fetch(SQL.sql("counters_wal"), a.lsn, b.lsn, timeout=120)
        except FleetqError as exc:
            # a failed statement is a rolled-back transaction: still the harness's own
            self.ledger.spend(READ)
            self.walinspect = False
            self.notes.append(f"WAL unreadable from here on, server-wide figures: {exc}")
            return server_wide(a, b)
        self.ledger.spend(READ)
        return Wal(int(row["write_xacts"]), int(row["wal_bytes"]))

    async def _flushed(self, lsn: str, deadline_s: float = 10.0) -> None:
        """Wait until the WAL up to `lsn` is flushed: pg_walinspect reads only flushed WAL,
        and with synchronous_commit off (the test suite's servers) a commit returns
        before its records are (the WAL writer flushes them within wal_writer_delay)."""
        end = time.monotonic() + deadline_s
        while True:
            (row,) = await self.driver.fetch(SQL.sql("counters_flushed"), lsn)
            self.ledger.spend(READ)
            if row["flushed"] or time.monotonic() > end:
                return
            await asyncio.sleep(0.02)  # polling the flush position, with a deadline

    def _backends(self, pids: list[int]) -> dict[int, float]:
        if self.server is None:
            return {}
        out = {}
        for pid in pids:
            try:
                out[int(pid)] = _own_cpu(psutil.Process(int(pid)))
            except psutil.Error:
                continue  # left between the query and the read
        return out


def tree_cpu(processes: Sequence[psutil.Process]) -> float:
    """CPU seconds of `processes` and of the children each has reaped."""
    return sum(_tree_cpu(p.cpu_times()) for p in processes)


def server_cpu(postmaster: psutil.Process | None) -> float | None:
    """CPU seconds of the whole PostgreSQL server: the postmaster, the backends it has
    reaped (their times land in its children's times) and those alive now. The
    postmaster is read first, so a backend reaped between the two reads is missed
    rather than counted twice. None when the server's processes cannot be read."""
    if postmaster is None:
        return None
    try:
        total = _tree_cpu(postmaster.cpu_times())
        children = postmaster.children()
    except psutil.Error:
        return None
    for child in children:
        try:
            total += _own_cpu(child)
        except psutil.Error:
            continue  # gone between the listing and the read; reaped: counted next time
    return total


def find_server(backend_pid: int, started: float) -> tuple[psutil.Process | None, str | None]:
    """The postmaster, as the parent of this session's backend, when that backend runs
    on this machine (a process of its pid started when the server says it did, `started`),
    else None and why."""
    try:
        backend = psutil.Process(backend_pid)
        if abs(backend.create_time() - started) > 2.0:
            return None, "the server does not run on this machine"
        postmaster = backend.parent()
        if postmaster is None:
            return None, "the backend's process has no parent here"
        postmaster.cpu_times()
    except psutil.NoSuchProcess:
        return None, "the server does not run on this machine"
    except psutil.Error as exc:
        return None, f"the server's processes cannot be read ({exc.__class__.__name__})"
    return postmaster, None


def _tree_cpu(t: Any) -> float:
    return float(t.user + t.system + t.children_user + t.children_system)


def _own_cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)
