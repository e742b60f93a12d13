"""The benchmark's counters and its peers' SQL blocks against a real server."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import psutil
import psycopg
import pytest

from fleetq.core.db import SyncConnection, connect
from fleetq_bench.counters import SQL, Cost
from fleetq_bench.phases import open_counters

PEER_SCHEMAS = {"pgqueuer": "pgqueuer_", "procrastinate": "procrastinate_", "floor": "floor_"}
LIBRARIES = {"pgqueuer", "procrastinate"}  # the floor is fleetq's own: no library


def _available(conn: SyncConnection, extension: str) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_available_extensions WHERE name = $1", (extension,)
    ).fetchone()
    return bool(row and row[0])


def _needs_walinspect(empty_dsn: str) -> None:
    with connect(empty_dsn) as conn:
        if not _available(conn, "pg_walinspect"):
            pytest.skip("this server has no pg_walinspect")


async def test_one_insert_is_one_write_transaction_of_this_database(empty_dsn: str) -> None:
    _needs_walinspect(empty_dsn)
    counters, notes = await open_counters(empty_dsn)
    try:
        assert counters.walinspect
        with connect(empty_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (v int)")
            a = await counters.read()
            conn.execute("INSERT INTO t VALUES (1)")
            conn.execute("SELECT count(*) FROM t")  # reads take no transaction id
            b = await counters.read()
        wal = await counters.wal(a, b)
        assert wal.write_xacts == 1
        assert wal.wal_bytes > 0
        assert b.next_xid - a.next_xid >= 1  # the server's: others may add to it
        assert b.own.statements - a.own.statements == 1  # `a` itself, booked after it
        if counters.statements:
            # the insert and the count, and `a`'s own read
            assert b.statements is not None and a.statements is not None
            assert b.statements - a.statements == 3
        else:
            assert any("pg_stat_statements" in n for n in notes)
    finally:
        await counters.driver.close()


async def test_wal_of_an_idle_database_is_empty(empty_dsn: str) -> None:
    _needs_walinspect(empty_dsn)
    counters, _ = await open_counters(empty_dsn)
    try:
        a = await counters.read()
        b = await counters.read()
        wal = await counters.wal(a, b)
        # reads may still write WAL (pruning a catalog page on access), never a
        # transaction of their own
        assert wal.write_xacts == 0
        # two reads, and, when another database wrote in between (tests run side by
        # side), the polls for its flush and the WAL query: reads all, each counted
        assert counters.ledger.statements >= 2 and counters.ledger.write_xacts == 0
    finally:
        await counters.driver.close()


async def test_the_server_process_is_found_when_it_runs_here(empty_dsn: str) -> None:
    counters, notes = await open_counters(empty_dsn)
    try:
        snap = await counters.read()
        if counters.server is None:
            assert any("server CPU" in n for n in notes)
            # only when it truly runs elsewhere: not when the postmaster is on this machine
            # (found once from the postmaster's own start time, which a step of the clock
            # since moved by seconds, and every compare's server CPU went missing)
            assert not _postmaster_here(empty_dsn), notes
            return
        assert snap.server_cpu_s is not None and snap.server_cpu_s > 0
        # the counters' own backend is one of the database's
        assert snap.backends_cpu_s
    finally:
        await counters.driver.close()


def _postmaster_here(dsn: str) -> bool:
    """Whether the server's postmaster is a process of this machine (its pid, from the
    server's data directory, names a running `postgres` here)."""
    with connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    pidfile = Path(str(row[0])) / "postmaster.pid" if row else None
    try:
        pid = int(pidfile.read_text().split()[0]) if pidfile else 0
    except (OSError, ValueError, IndexError):
        return False
    return psutil.pid_exists(pid) and psutil.Process(pid).name() in {"postgres", "postmaster"}


def test_counter_blocks_prepare(empty_dsn: str) -> None:
    with connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        walinspect = _available(conn, "pg_walinspect")
        if walinspect:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        for name in SQL.names():
            if name.startswith((*PEER_SCHEMAS.values(), "counters_create", "bench_")):
                continue  # the peers' and fleetq's schemas: their own tests
            if name == "counters_wal" and not walinspect:
                continue
            _prepare(conn, name)


@pytest.mark.parametrize("peer", sorted(PEER_SCHEMAS))
def test_peer_blocks_prepare_against_the_peers_schema(
    empty_dsn: str, peer: str, tmp_path: Path
) -> None:
    if peer in LIBRARIES and importlib.util.find_spec(peer) is None:
        pytest.skip(f"{peer} is not installed (uv run --project bench installs it)")
    from fleetq_bench.peers import SYSTEMS, load

    system = next(s for s in SYSTEMS.values() if s.kind == peer)
    asyncio.run(load(system).install(empty_dsn, tmp_path))
    with connect(empty_dsn, autocommit=True) as conn:
        for name in SQL.names():
            if name.startswith(PEER_SCHEMAS[peer]) and not name.endswith("_install"):
                _prepare(conn, name)


def _prepare(conn: SyncConnection, name: str) -> None:
    try:
        conn.execute(f"PREPARE check_block AS {SQL.sql(name).rstrip(';')}".encode())
        conn.execute("DEALLOCATE check_block")
    except psycopg.Error as exc:
        pytest.fail(f"{name}: {exc}")


def test_a_read_costs_one_statement_and_one_transaction() -> None:
    assert Cost() == Cost(statements=1, xacts=1, write_xacts=0)
