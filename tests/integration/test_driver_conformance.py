"""asyncpg and psycopg run the same SQL blocks and give the same answers."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from fleetq.core import eligibility, fleet, leasing, producer, readers
from fleetq.core.db import connect, with_database
from fleetq.core.driver import open_driver
from fleetq.core.errors import IdempotencyConflict, StaleLease
from fleetq.core.models import JobId, Outcome, OutcomeReport, Registration, StartReport
from tests import fleet as test_fleet
from tests.conftest import create_database, drop_database
from tests.fleet import SHA


async def _scenario(dsn: str, kind: str) -> dict[str, Any]:
    """A whole job life, with an error and a stale write, reduced to driver-free facts."""
    async with open_driver(dsn, kind=kind) as d:
        runner = await fleet.register(
            d,
            Registration(
                node="n",
                name="r",
                capabilities=["linux"],
                memory_mb=4096,
                cpu_millis=4000,
                lanes={"checks": 2},
            ),
        )
        sub = await producer.submit(
            d,
            project="tools",
            operation="lint",
            commit=SHA,
            submitted_by="alice",
            idempotency_key="k",
            payload={"nested": {"list": [1, "two", None]}},
        )
        with pytest.raises(IdempotencyConflict):
            await producer.submit(
                d,
                project="tools",
                operation="lint",
                commit=SHA,
                submitted_by="alice",
                idempotency_key="k",
                payload={},
            )
        (claim,) = await leasing.claim(
            d, runner=runner, lane="checks", limit=5, claim_id=uuid.uuid4()
        )
        start = StartReport(
            job_id=claim.job_id,
            lease_version=claim.lease_version,
            node="n",
            run_id=uuid.UUID(int=7),
            pid=7,
            process_started_at=datetime.now(UTC),
        )
        started = await leasing.report_start(d, runner=runner, start=start)
        beats = await leasing.heartbeat(
            d, runner=runner, leases=[(claim.job_id, claim.lease_version)]
        )
        report = OutcomeReport(
            job_id=claim.job_id,
            lease_version=claim.lease_version,
            outcome=Outcome.SUCCEEDED,
            exit_code=0,
            log_tail="done",
        )
        done = await leasing.complete(d, runner=runner, outcome=report)
        again = await leasing.complete(d, runner=runner, outcome=report)
        with pytest.raises(StaleLease):
            await leasing.report_lost(
                d, runner=runner, job_id=claim.job_id, token=claim.lease_version, reason="late"
            )
        explained = await eligibility.explain(d, JobId(sub.job_id))
        return {
            "submit": sub.model_dump(),
            "claim_payload": claim.payload,
            "claim_token": claim.lease_version,
            "writes": [started, beats[0].status, done, again],
            "result": [
                r.model_dump(exclude={"recorded_at"})
                for r in await readers.result(d, project="tools", commit=SHA)
            ],
            "events": [
                (e.kind, e.lease_version, e.detail)
                for e in await readers.events(d, job_id=JobId(sub.job_id))
            ],
            "explain": explained.summary(),
            "runner": [(r.id, r.lanes, r.reserved_memory_mb) for r in await fleet.runners(d)],
        }


async def test_both_drivers_agree(server_dsn: str, template_db: str) -> None:
    facts: dict[str, dict[str, Any]] = {}
    for kind in ("asyncpg", "psycopg"):
        name = create_database(server_dsn, template_db)
        dsn = with_database(server_dsn, name)
        try:
            with connect(dsn, autocommit=True) as conn:
                test_fleet.operations(conn)
            facts[kind] = await _scenario(dsn, kind)
        finally:
            drop_database(server_dsn, name)
    assert facts["asyncpg"] == facts["psycopg"]
    assert facts["asyncpg"]["writes"] == ["ok", "ok", "ok", "already"]
    assert facts["asyncpg"]["claim_payload"] == {"nested": {"list": [1, "two", None]}}


@pytest.mark.parametrize("kind", ["asyncpg", "psycopg", "sync"])
async def test_every_session_reads_committed_whatever_the_role_s_default(
    db_dsn: str, kind: str
) -> None:
    """fleetq refuses endings and dependent submits at REPEATABLE READ; a database or
    role defaulting to it stopped the runner, the CLI and the API (a review's finding)."""
    role = f"iso_{kind}"
    with connect(db_dsn, autocommit=True) as admin:
        admin.execute(f"DROP ROLE IF EXISTS {role}".encode())
        admin.execute(f"CREATE ROLE {role} LOGIN SUPERUSER".encode())
        admin.execute(
            f"ALTER ROLE {role} SET default_transaction_isolation = 'serializable'".encode()
        )
    dsn = db_dsn.replace("postgresql://postgres@", f"postgresql://{role}@", 1)
    assert dsn != db_dsn
    try:
        if kind == "sync":
            with connect(dsn) as conn:
                row = conn.execute(b"SHOW transaction_isolation").fetchone()
            assert row == ("read committed",)
        else:
            async with open_driver(dsn, kind=kind) as d:
                rows = await d.fetch("SHOW transaction_isolation")
            assert rows == [{"transaction_isolation": "read committed"}]
    finally:
        with connect(db_dsn, autocommit=True) as admin:
            admin.execute(f"DROP ROLE {role}".encode())
