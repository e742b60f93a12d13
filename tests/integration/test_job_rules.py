"""The rules a job's row keeps (migration 0027): one CHECK constraint calls a plpgsql
function that holds them all, compiled once per session instead of fifteen constraints
rebuilt from their text for every statement that writes a job. Each rule still refuses
a row that breaks it, under its old constraint's name, and nothing else is refused."""

from __future__ import annotations

import psycopg
import pytest

from fleetq.core.db import SyncConnection
from fleetq.core.resources import shipped_dir
from tests import factories


@pytest.fixture
def job(sync_conn: SyncConnection) -> int:
    """A queued job, which keeps every rule."""
    return factories.job(sync_conn)


def state_of(conn: SyncConnection, job: int) -> str | None:
    row = conn.execute("SELECT state FROM fleetq.jobs WHERE id = $1", [job]).fetchone()
    return None if row is None else str(row[0])


# Each change breaks one rule of a queued job and no other.
BREAKS = {
    "jobs_attempts_check": "attempts = 0",
    "jobs_check": "lease_owner = 'node-a/r1', lease_expires_at = now()",
    "jobs_check1": (
        "state = 'claimed', lease_owner = 'node-a/r1', lease_expires_at = now(), "
        "reserved_on = 'node-b/r1'"
    ),
    "jobs_check2": "finished_at = now()",
    "jobs_commit_sha_check": "commit_sha = 'abc'",
    "jobs_cpu_millis_check": "cpu_millis = -1",
    "jobs_idempotency_key_check": "idempotency_key = ''",
    "jobs_lease_version_check": "lease_version = -1",
    "jobs_memory_mb_check": "memory_mb = -1",
    "jobs_priority_class_check": "priority_class = 3",
    "jobs_promotions_check": "promotions = 3",
    "jobs_retry_waits": "retry_at = now()",
    "jobs_state_check": "state = 'lost'",
    "jobs_timeout_s_check": "timeout_s = 0",
    "jobs_traceparent_check": "traceparent = 'trace me'",
}


@pytest.mark.parametrize("rule", sorted(BREAKS))
def test_each_rule_of_a_job_s_row_refuses_a_row_that_breaks_it(
    sync_conn: SyncConnection, job: int, rule: str
) -> None:
    with pytest.raises(psycopg.errors.CheckViolation) as caught:
        sync_conn.execute(f"UPDATE fleetq.jobs SET {BREAKS[rule]} WHERE id = $1", [job])
    assert caught.value.diag.constraint_name == rule
    assert caught.value.diag.table_name == "jobs"
    assert f'violates check constraint "{rule}"' in str(caught.value)
    assert state_of(sync_conn, job) == "queued"


def test_a_row_that_keeps_every_rule_is_written(sync_conn: SyncConnection, job: int) -> None:
    """What the rules allow: a live lease held on its runner's capacity, a key, a trace, an
    ended job with its end, and NULL where a rule's column is optional."""
    sync_conn.execute(
        "UPDATE fleetq.jobs SET state = 'claimed', lease_owner = 'node-a/r1', "
        "reserved_on = 'node-a/r1', lease_expires_at = now(), lease_version = 1, "
        "idempotency_key = 'k', traceparent = $2, promotions = 2, priority_class = 0 "
        "WHERE id = $1",
        [job, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"],
    )
    sync_conn.execute(
        "UPDATE fleetq.jobs SET state = 'succeeded', lease_owner = NULL, reserved_on = NULL, "
        "lease_expires_at = NULL, finished_at = now(), idempotency_key = NULL, "
        "traceparent = NULL WHERE id = $1",
        [job],
    )
    assert state_of(sync_conn, job) == "succeeded"


def test_a_job_s_rules_are_one_constraint_compiled_once_per_session(
    sync_conn: SyncConnection,
) -> None:
    """A CHECK written inline on fleetq.jobs is rebuilt from its text by every statement
    that writes a job: a rule belongs in fleetq.jobs_row_ok (a new migration)."""
    checks = sync_conn.execute(
        "SELECT conname, pg_get_constraintdef(oid), convalidated FROM pg_constraint "
        "WHERE conrelid = 'fleetq.jobs'::regclass AND contype = 'c' ORDER BY conname"
    ).fetchall()
    assert [name for name, _, _ in checks] == ["jobs_rules"], checks
    assert checks[0][1].startswith("CHECK (fleetq.jobs_row_ok("), checks
    assert checks[0][2], "added NOT VALID by migration 0027, validated by 0028"
    (language,) = sync_conn.execute(
        "SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
        "WHERE p.oid = 'fleetq.jobs_row_ok'::regproc"
    ).fetchone() or (None,)
    assert language == "plpgsql"  # a SQL function would be inlined: its text again


def test_validating_the_rules_outlasts_the_migration_sessions_statement_timeout(
    sync_conn: SyncConnection, job: int
) -> None:
    """Migration 0028 reads every job, and `fleetq migrate`'s sessions stop a statement
    after 30 s: past a few million jobs it could never be applied. It lifts the limit
    for its own transaction (here the limit is 1 ms, and 20,000 jobs take longer)."""
    sync_conn.execute(
        "INSERT INTO fleetq.jobs (project, operation, commit_sha, lane, timeout_s, "
        "submitted_by, priority_class) SELECT project, operation, commit_sha, lane, "
        "timeout_s, submitted_by, priority_class FROM fleetq.jobs, generate_series(1, 20000) "
        "WHERE id = $1",
        [job],
    )
    (rules,) = sync_conn.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'jobs_rules'"
    ).fetchone() or ("",)
    sync_conn.execute(
        f"ALTER TABLE fleetq.jobs DROP CONSTRAINT jobs_rules, "
        f"ADD CONSTRAINT jobs_rules {rules} NOT VALID"
    )
    migration = shipped_dir("migrations") / "0028_job_rules_validated.sql"
    with sync_conn.transaction():
        sync_conn.execute("SET LOCAL statement_timeout = '1ms'")
        sync_conn.execute(migration.read_text())
    (valid,) = sync_conn.execute(
        "SELECT convalidated FROM pg_constraint WHERE conname = 'jobs_rules'"
    ).fetchone() or (False,)
    assert valid
