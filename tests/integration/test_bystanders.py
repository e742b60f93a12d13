"""Every write of the protocol touches only what it names. Two runners hold jobs in every
state a lease has (claimed, running, stop pending) and one of them acts: pauses, drains,
registers again, renews, starts, finishes, fails into a retry that comes due, hands
back, reports a loss, confirms a stop, or has its leases reaped. The other runner's
row, its lanes, its jobs and their executions must read exactly as before, to the
microsecond. A write whose WHERE lost its key (a mutant of any of these functions)
changes them; and no time it wrote lies in the future (tests/stamps.py), checked at once,
before a later write could cover it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from fleetq.core import fleet as fleet_api
from fleetq.core import leasing, producer
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver
from fleetq.core.models import (
    Claim,
    Outcome,
    OutcomeReport,
    Registration,
    RunnerId,
    RunnerState,
)
from tests import fleet, stamps
from tests.fleet import SHA


@dataclass
class Holding:
    """What one runner holds: a running job, a claimed one, a cancelled one still running."""

    runner: RunnerId
    running: Claim
    claimed: Claim
    stopping: Claim


Act = Callable[[Driver, SyncConnection, Holding], Awaitable[Any]]


async def _holding(driver: Driver, name: str, node: str) -> Holding:
    runner = await fleet.runner(driver, name, node=node)
    (running,) = await fleet.running(driver, runner)
    (claimed,) = await fleet.running(driver, runner, started=False)
    (stopping,) = await fleet.running(driver, runner)
    await producer.cancel(driver, job_id=stopping.job_id, actor="alice", reason="enough")
    return Holding(runner, running, claimed, stopping)


def _rows(conn: SyncConnection, runner: str) -> dict[str, list[Any]]:
    """Everything of `runner`'s, as JSON, in a stable order."""
    queries = {
        "runner": "SELECT to_jsonb(r) FROM fleetq.runners r WHERE r.id = $1",
        "lanes": "SELECT to_jsonb(l) FROM fleetq.runner_lanes l WHERE l.runner_id = $1 "
        "ORDER BY l.lane",
        "jobs": "SELECT to_jsonb(j) FROM fleetq.jobs j "
        "WHERE j.lease_owner = $1 OR j.reserved_on = $1 ORDER BY j.id",
        "executions": "SELECT to_jsonb(e) FROM fleetq.executions e "
        "WHERE e.runner_id = $1 ORDER BY e.job_id, e.lease_version",
    }
    return {
        name: [row[0] for row in conn.execute(sql.encode(), [runner]).fetchall()]
        for name, sql in queries.items()
    }


def _outcome(claim: Claim) -> OutcomeReport:
    return OutcomeReport(
        job_id=claim.job_id,
        lease_version=claim.lease_version,
        outcome=Outcome.SUCCEEDED,
        exit_code=0,
    )


def _set(state: RunnerState) -> Act:
    async def act(driver: Driver, conn: SyncConnection, h: Holding) -> Any:
        return await fleet_api.set_state(
            driver, runner=h.runner, state=state, reason="look", actor="ops"
        )

    return act


async def _register_again(driver: Driver, conn: SyncConnection, h: Holding) -> Any:
    return await fleet_api.register(
        driver,
        Registration(
            node="node-a",
            name="r1",
            capabilities=[],
            memory_mb=8192,
            cpu_millis=4000,
            lanes={"checks": 5, "control": 1},
        ),
    )


async def _renew(driver: Driver, conn: SyncConnection, h: Holding) -> Any:
    leases = [(c.job_id, c.lease_version) for c in (h.running, h.claimed, h.stopping)]
    return await leasing.heartbeat(driver, runner=h.runner, leases=leases)


async def _start_claimed(driver: Driver, conn: SyncConnection, h: Holding) -> Any:
    return await leasing.report_start(driver, runner=h.runner, start=fleet.start_report(h.claimed))


async def _complete(driver: Driver, conn: SyncConnection, h: Holding) -> Any:
    return await leasing.complete_many(
        driver, runner=h.runner, outcomes=[_outcome(h.running), _outcome(h.claimed)]
    )


async def _release(driver: Driver, conn: SyncConnection, h: Holding) -> Any:
    return await leasing.release(
        driver,
        runner=h.runner,
        job_id=h.running.job_id,
        token=h.running.lease_version,
        reason="shutting down",
    )


async def _report_lost(driver: Driver, conn: SyncConnection, h: Holding) -> Any:
    return await leasing.report_lost(
        driver,
        runner=h.runner,
        job_id=h.claimed.job_id,
        token=h.claimed.lease_version,
        reason="launched nothing",
    )


async def _confirm_stop(driver: Driver, conn: SyncConnection, h: Holding) -> Any:
    return await leasing.confirm_stop(
        driver,
        runner=h.runner,
        job_id=h.stopping.job_id,
        token=h.stopping.lease_version,
        signal=15,
        reason="cancelled",
    )


async def _reaped(driver: Driver, conn: SyncConnection, h: Holding) -> Any:
    conn.execute(
        "UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() - interval '1 second' "
        "WHERE lease_owner = $1",
        [h.runner],
    )
    return await leasing.reap(driver)


async def _fail_into_a_retry(driver: Driver, conn: SyncConnection, h: Holding) -> Any:
    conn.execute(
        "UPDATE fleetq.operations SET retry = "
        '\'{"max_attempts": 2, "on": ["exit"], "backoff_seconds": 1}\' '
        "WHERE name = 'lint'"
    )
    report = OutcomeReport(
        job_id=h.running.job_id,
        lease_version=h.running.lease_version,
        outcome=Outcome.FAILED,
        exit_code=3,
        reason="exit",
    )
    return await leasing.complete(driver, runner=h.runner, outcome=report)


async def _retry_due(driver: Driver, conn: SyncConnection, h: Holding) -> Any:
    await _fail_into_a_retry(driver, conn, h)
    (at,) = conn.execute(
        "SELECT retry_at FROM fleetq.jobs WHERE id = $1", [h.running.job_id]
    ).fetchone() or (None,)
    return await leasing.reap(driver, now=at + timedelta(milliseconds=1))


async def _complete_what_another_waits_on(driver: Driver, conn: SyncConnection, h: Holding) -> Any:
    await producer.submit(
        driver,
        project="tools",
        operation="lint",
        commit=SHA,
        submitted_by="alice",
        after=[h.running.job_id],
    )
    return await leasing.complete(driver, runner=h.runner, outcome=_outcome(h.running))


async def _confirm_stop_seen_ended(driver: Driver, conn: SyncConnection, h: Holding) -> Any:
    return await leasing.confirm_stop(
        driver,
        runner=h.runner,
        job_id=h.stopping.job_id,
        token=h.stopping.lease_version,
        signal=15,
        reason="cancelled",
        ended_monotonic=time.monotonic() - 0.2,
    )


ACTS: dict[str, Act] = {
    "pause": _set(RunnerState.PAUSED),
    "drain": _set(RunnerState.DRAINING),
    "register again": _register_again,
    "renew": _renew,
    "start": _start_claimed,
    "complete": _complete,
    "release": _release,
    "report lost": _report_lost,
    "confirm stop": _confirm_stop,
    "reaped": _reaped,
    "fail into a retry": _fail_into_a_retry,
    "complete what another waits on": _complete_what_another_waits_on,
    "confirm a stop seen ended": _confirm_stop_seen_ended,
    "retry due": _retry_due,
}


@pytest.mark.parametrize("act", list(ACTS), ids=list(ACTS))
async def test_one_runner_s_write_leaves_the_other_s_rows_as_they_were(
    act: str, driver: Driver, sync_conn: SyncConnection, db_dsn: str
) -> None:
    fleet.operations(sync_conn)
    one = await _holding(driver, "r1", "node-a")
    other = await _holding(driver, "r2", "node-b")
    before = _rows(sync_conn, other.runner)
    mine = _rows(sync_conn, one.runner)
    await ACTS[act](driver, sync_conn, one)
    assert _rows(sync_conn, one.runner) != mine, "the act changed nothing: it proves nothing"
    # at once, before a later write of the same row could cover an offset clock
    assert not stamps.future_stamps(db_dsn), f"{stamps.FAILURE} by {act}"
    after = _rows(sync_conn, other.runner)
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert not changed, f"{act} by {one.runner} changed {other.runner}'s rows: {changed}"
