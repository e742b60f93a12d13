"""The counters' arithmetic: per-job costs from snapshots, the harness's own work off."""

from __future__ import annotations

import dataclasses

import pytest

from fleetq.core.errors import FleetqError
from fleetq_bench import counters
from fleetq_bench.counters import READ, Cost, IdleRate, Ledger, Snapshot, Wal, per_job
from fleetq_bench.peers import System, load


def snap(at: float, **kw: object) -> Snapshot:
    base: dict[str, object] = {
        "at": at,
        "next_xid": 1000,
        "lsn": "0/0",
        "wal_bytes": 0,
        "xacts": 0,
        "rollbacks": 0,
        "rows_inserted": 0,
        "foreign_xacts": 0,
        "statements": 0,
        "evictions": 0,
        "server_cpu_s": 0.0,
        "backends_cpu_s": {},
        "workers_cpu_s": 0.0,
        "harness_cpu_s": 0.0,
        "own": Ledger(),
    }
    base.update(kw)
    return Snapshot(**base)  # type: ignore[arg-type]


def test_ledger_books_calls() -> None:
    ledger = Ledger()
    ledger.spend(READ, 3)
    ledger.spend(Cost(statements=3, xacts=1, write_xacts=1), 2)
    assert (ledger.statements, ledger.xacts, ledger.write_xacts) == (9, 5, 2)
    copy = ledger.copy()
    ledger.spend(READ)
    assert copy.statements == 9


def test_per_job_takes_the_harness_and_the_idle_tail_off() -> None:
    before = snap(0.0, xacts=100, statements=50, own=Ledger(10, 10, 0), foreign_xacts=7)
    drained = snap(
        2.0,
        statements=50 + 220,
        own=Ledger(10 + 20, 10 + 20, 1),
        workers_cpu_s=0.5,
        server_cpu_s=0.25,
        backends_cpu_s={11: 0.2},
        harness_cpu_s=0.1,
    )
    # 10 s after the drain: 400 transactions counted, 2 of them the harness's reads,
    # and the idle workers' 5/s over those 10 s
    settled = snap(
        12.0, xacts=100 + 400, rollbacks=30, own=Ledger(10 + 22, 10 + 22, 1), foreign_xacts=9
    )
    wal = Wal(write_xacts=101, wal_bytes=200_000)
    costs = per_job(before, drained, settled, 100, IdleRate(5.0), wal)
    assert costs["write_xacts_per_job"] == 1.0  # 101 less the harness's bulk enqueue
    assert costs["statements_per_job"] == 2.0  # 220 less its 20 statements
    assert costs["xacts_per_job"] == pytest.approx((400 - 22 - 50) / 100)
    assert costs["rollbacks_per_job"] == 0.3
    assert costs["wal_bytes_per_job"] == 2000
    assert costs["worker_cpu_ms_per_job"] == 5.0
    assert costs["server_total_cpu_ms_per_job"] == 2.5
    assert costs["server_cpu_ms_per_job"] == 2.0
    assert costs["harness_cpu_ms_per_job"] == 1.0
    assert costs["foreign_xacts"] == 2


def test_per_job_without_statement_statistics_says_null() -> None:
    a = snap(0.0, statements=None, evictions=None)
    b = snap(1.0, statements=None, evictions=None)
    costs = per_job(a, b, b, 10, IdleRate(0.0), Wal(0, 0))
    assert costs["statements_per_job"] is None
    assert costs["statements_evictions"] is None


def test_per_job_reports_evictions_of_statement_entries() -> None:
    a, b = snap(0.0, evictions=3), snap(1.0, evictions=5)
    costs = per_job(a, b, b, 1, IdleRate(0), Wal(0, 0))
    assert costs["statements_evictions"] == 2


def test_per_job_needs_jobs() -> None:
    a = snap(0.0)
    with pytest.raises(ValueError, match="at least one job"):
        per_job(a, a, a, 0, IdleRate(0.0), Wal(0, 0))


def test_idle_rate_leaves_the_harness_reads_out() -> None:
    a = snap(10.0, xacts=1000, own=Ledger(5, 5, 0))
    b = snap(15.0, xacts=1026, own=Ledger(6, 6, 0))
    assert IdleRate.between(a, b).xacts_per_s == 5.0
    assert IdleRate.between(a, a).xacts_per_s == 0.0


def test_server_wide_fallback_reads_ids_and_positions() -> None:
    a = snap(0.0, next_xid=10, wal_bytes=100)
    b = snap(1.0, next_xid=25, wal_bytes=900)
    assert counters.server_wide(a, b) == Wal(15, 800)


def test_backends_cpu_counts_new_backends_whole() -> None:
    a = snap(0.0, backends_cpu_s={1: 1.0, 2: 2.0})
    b = snap(1.0, backends_cpu_s={1: 1.5, 3: 0.25})
    assert counters.backends_cpu(a, b) == 0.75
    assert counters.backends_cpu(snap(0.0), snap(1.0)) is None


def test_server_cpu_of_no_server_is_unknown() -> None:
    assert counters.server_cpu(None) is None


def test_a_missing_peer_library_says_how_to_install_it() -> None:
    missing = dataclasses.replace(System("x", "fleetq", 1, 1, ""), kind="no_such_peer")
    with pytest.raises(FleetqError, match=r"uv run --project bench"):
        load(missing)
