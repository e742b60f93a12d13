"""The scale benchmark's finished history reads like jobs the protocol finished."""

from __future__ import annotations

from fleetq.core.db import SyncConnection
from fleetq_bench.sql import SQL
from tests import factories


def _history(conn: SyncConnection, first: int, last: int) -> str:
    factories.operation(conn, "tools", "lint")
    runner = factories.runner(conn, lanes={"checks": 4})
    (row,) = conn.execute(
        SQL.sql("bench_scale_history"), [first, last, runner, "tools", "lint", "checks"]
    ).fetchall()
    assert row[0] == last - first + 1
    return runner


def test_history_has_every_row_a_finished_job_has(sync_conn: SyncConnection) -> None:
    runner = _history(sync_conn, 1, 30)
    jobs = sync_conn.execute(
        "SELECT count(*), count(DISTINCT commit_sha), "
        "bool_and(state = 'succeeded' AND lease_owner IS NULL AND reserved_on IS NULL "
        "AND created_at < claimed_at AND claimed_at < started_at AND started_at < finished_at "
        "AND finished_at < clock_timestamp()) FROM fleetq.jobs"
    ).fetchall()
    assert jobs == [(30, 30, True)]
    executions = sync_conn.execute(
        "SELECT count(*), bool_and(e.ended_at = j.finished_at AND e.runner_id = $1 "
        "AND e.lease_version = j.lease_version) "
        "FROM fleetq.executions e JOIN fleetq.jobs j ON j.id = e.job_id",
        [runner],
    ).fetchall()
    assert executions == [(30, True)]
    kinds = sync_conn.execute(
        "SELECT kind, count(*) FROM fleetq.events WHERE job_id IS NOT NULL "
        "GROUP BY kind ORDER BY kind"
    ).fetchall()
    assert kinds == [(k, 30) for k in ("claimed", "started", "submitted", "succeeded")]
    verdicts = sync_conn.execute(
        "SELECT verdict, count(*) FROM fleetq.results GROUP BY verdict"
    ).fetchall()
    assert verdicts == [("passed", 30)]


def test_history_batches_follow_each_other(sync_conn: SyncConnection) -> None:
    runner = _history(sync_conn, 1, 10)
    (row,) = sync_conn.execute(
        SQL.sql("bench_scale_history"), [11, 25, runner, "tools", "lint", "checks"]
    ).fetchall()
    assert row[0] == 15
    (sizes,) = sync_conn.execute(SQL.sql("bench_scale_sizes")).fetchall()
    assert sizes[0] == 25 and sizes[1] > 0


def test_vacuum_block_runs_outside_a_transaction(sync_conn: SyncConnection) -> None:
    """The one block the PREPARE check cannot run (test_sql.py)."""
    _history(sync_conn, 1, 5)
    sync_conn.execute(SQL.sql("bench_scale_vacuum"))
    rows = sync_conn.execute(
        "SELECT reltuples FROM pg_class WHERE oid = 'fleetq.jobs'::regclass"
    ).fetchall()
    assert rows == [(5,)]
