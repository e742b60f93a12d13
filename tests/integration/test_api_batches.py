"""Runners' routine calls batched by the API (fleetq/api/batches.py, issue 46): many
runners' calls in one transaction, each acting for its own token only, and one call that
fails costs the others nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from fleetq.api.batches import CHECK_ONLY, Batches, batched
from fleetq.api.gateway import Gateway
from fleetq.api.runners import runner_batches
from fleetq.core import errors, leasing, producer, roles, tokens, wire
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver
from fleetq.core.models import RunnerId
from tests import fleet
from tests.fleet import SHA

HEARTBEAT = "lease_heartbeat"


@pytest.fixture
async def runs(db_dsn: str) -> AsyncIterator[Batches]:
    """The API's batches over a gateway on this test's database; a window long enough
    that calls made together land in one batch."""
    gateway = Gateway(db_dsn, pool_size=4)
    await gateway.open()
    batches = runner_batches(gateway, window_s=0.5)
    try:
        yield batches
    finally:
        await batches.close()
        await gateway.close()


def _token(conn: SyncConnection, kind: str, subject: str, *, revoked: bool = False) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    _, secret = tokens.add(conn, roles.Kind(kind), subject, name=name, created_by="t")
    if revoked:
        assert tokens.revoke(conn, name)
    return secret


def _beat(runner: RunnerId, jobs: list[int], versions: list[int]) -> list[Any]:
    return [wire.encode(runner), wire.encode(jobs), wire.encode(versions)]


async def _runner_with_a_lease(driver: Driver, name: str) -> tuple[RunnerId, int, int]:
    runner = await fleet.runner(driver, name, node=f"node-{name}")
    job = await producer.submit(
        driver, project="tools", operation="lint", commit=SHA, submitted_by="t"
    )
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    assert claim.job_id == job.job_id
    return runner, int(claim.job_id), int(claim.lease_version)


async def _expiry(driver: Driver, job: int) -> object:
    rows = await driver.fetch("SELECT lease_expires_at FROM fleetq.jobs WHERE id = $1", job)
    return rows[0]["lease_expires_at"]


async def test_many_runners_heartbeats_go_in_one_transaction_each_as_itself(
    runs: Batches, driver: Driver, sync_conn: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    held = [await _runner_with_a_lease(driver, f"r{i}") for i in range(5)]
    secrets = [_token(sync_conn, "runner", runner) for runner, _, _ in held]
    before = [await _expiry(driver, job) for _, job, _ in held]
    answers = await asyncio.gather(
        *(
            runs.call(secret, HEARTBEAT, _beat(runner, [job], [version]), 10)
            for secret, (runner, job, version) in zip(secrets, held, strict=True)
        ),
        runs.call(secrets[0], CHECK_ONLY, [], 5),
    )
    assert (runs.batches, runs.calls, runs.run_alone) == (1, 6, 0)
    for (caller, rows), (runner, job, _) in zip(answers, held, strict=False):
        assert caller.identity == runner
        assert [(r["job_id"], r["status"]) for r in rows] == [(job, "ok")]
    for (_, job, _), earlier in zip(held, before, strict=True):
        assert await _expiry(driver, job) > earlier  # type: ignore[operator]


async def test_a_call_refused_in_a_batch_costs_the_others_nothing(
    runs: Batches, driver: Driver, sync_conn: SyncConnection
) -> None:
    """A runner naming another's lease, a revoked token, a submitter's token and an
    argument the server cannot take, in one batch with two good heartbeats: each bad call
    gets the answer it gets alone, the good ones are renewed."""
    fleet.operations(sync_conn)
    (a, job_a, v_a), (b, job_b, v_b) = [
        await _runner_with_a_lease(driver, name) for name in ("a", "b")
    ]
    secret_a, secret_b = _token(sync_conn, "runner", a), _token(sync_conn, "runner", b)
    revoked = _token(sync_conn, "runner", RunnerId("node-x/x"), revoked=True)
    submitter = _token(sync_conn, "submitter", "ci")
    before_b = await _expiry(driver, job_b)
    results = await asyncio.gather(
        runs.call(secret_a, HEARTBEAT, _beat(b, [job_b], [v_b]), 10),  # a acting as b
        runs.call(revoked, HEARTBEAT, _beat(RunnerId("node-x/x"), [], []), 10),
        runs.call(submitter, HEARTBEAT, _beat(a, [job_a], [v_a]), 10),
        runs.call(secret_a, HEARTBEAT, [wire.encode(a), ["nope"], wire.encode([v_a])], 10),
        runs.call(secret_a, HEARTBEAT, _beat(a, [job_a], [v_a]), 10),
        runs.call(secret_b, HEARTBEAT, _beat(b, [job_b], [v_b]), 10),
        return_exceptions=True,
    )
    as_other, revoked_answer, not_a_runner, bad_argument, good_a, good_b = results
    assert isinstance(as_other, errors.PermissionDenied), as_other
    assert isinstance(revoked_answer, errors.NotAuthenticated), revoked_answer
    assert isinstance(not_a_runner, errors.PermissionDenied), not_a_runner
    assert "not a runner's" in str(not_a_runner)
    assert isinstance(bad_argument, errors.InvalidInput), bad_argument
    assert not isinstance(good_a, BaseException) and not isinstance(good_b, BaseException)
    assert [r["status"] for r in good_a[1]] == ["ok"]
    assert [r["status"] for r in good_b[1]] == ["ok"]
    assert await _expiry(driver, job_b) > before_b  # type: ignore[operator]
    assert runs.batches == 1 and runs.run_alone == 6  # the batch failed: each ran alone


async def test_the_reaper_runs_once_a_batch(
    runs: Batches, driver: Driver, sync_conn: SyncConnection
) -> None:
    fleet.operations(sync_conn)
    runners = [await fleet.runner(driver, f"p{i}", node=f"node-p{i}") for i in range(3)]
    secrets = [_token(sync_conn, "runner", r) for r in runners]
    reap = "lease_reap"
    answers = await asyncio.gather(  # its arguments differ: still one pass a batch
        *(
            runs.call(s, reap, [wire.encode(1000 - i), wire.encode(None)], 10)
            for i, s in enumerate(secrets)
        )
    )
    assert runs.batches == 1
    leaders = [rows[0]["leader"] for _, rows in answers]
    assert leaders.count(True) == 1, leaders


def test_a_heavy_routine_call_runs_alone() -> None:
    """A heartbeat naming 20,000 jobs (a runner has its slots' worth) runs at once, in a
    transaction of its own: it would hold every other runner's batch while it ran."""
    runner = RunnerId("node-heavy/r")
    assert batched("lease_heartbeat", _beat(runner, [1], [1]))
    assert not batched("lease_heartbeat", _beat(runner, list(range(20_000)), [1] * 20_000))
    assert not batched("lease_claim", [])  # never waits: its latency is the queue's
    assert batched(CHECK_ONLY, [])


async def test_one_calls_lock_wait_or_tiny_timeout_costs_the_others_nothing(
    runs: Batches, driver: Driver, sync_conn: SyncConnection, db_dsn: str
) -> None:
    """A heartbeat asking for a microsecond's timeout gets a second in a batch (it failed
    every call with it); a hold renewal that would wait on a row held elsewhere (a direct
    runner taking the id, another gateway's batch) in one batch with good heartbeats: the
    good ones are answered after the batch's short lock wait, each as it would be alone,
    and the waiting one once the row is free."""
    fleet.operations(sync_conn)
    (a, job_a, v_a), (b, job_b, v_b) = [
        await _runner_with_a_lease(driver, name) for name in ("la", "lb")
    ]
    secret_a, secret_b = _token(sync_conn, "runner", a), _token(sync_conn, "runner", b)
    tiny = await asyncio.gather(  # a microsecond asked: a batched statement has a second
        runs.call(secret_a, HEARTBEAT, _beat(a, [job_a], [v_a]), 1e-6),
        runs.call(secret_b, HEARTBEAT, _beat(b, [job_b], [v_b]), 10),
    )
    assert [[r["status"] for r in rows] for _, rows in tiny] == [["ok"]] * 2
    assert runs.run_alone == 0
    hold = "runners_hold_identity"
    await runs.call(secret_b, hold, [wire.encode(b), "bench", wire.encode(30)], 10)
    holder = await asyncpg.connect(db_dsn)
    try:
        blocker = holder.transaction()
        await blocker.start()
        await holder.execute(
            "SELECT 1 FROM fleetq.coordination WHERE name = $1 FOR UPDATE", f"runner:{b}"
        )
        waiting = asyncio.ensure_future(
            runs.call(secret_b, hold, [wire.encode(b), "bench", wire.encode(30)], 30)
        )
        quick = await asyncio.wait_for(
            asyncio.gather(
                runs.call(secret_a, HEARTBEAT, _beat(a, [job_a], [v_a]), 10),
                runs.call(secret_b, HEARTBEAT, _beat(b, [job_b], [v_b]), 10),
            ),
            timeout=20,
        )
        assert [[r["status"] for r in rows] for _, rows in quick] == [["ok"]] * 2
        assert runs.run_alone == 3  # the batch met the lock: each of its calls ran alone
        assert not waiting.done()  # alone, it waits for the row as it would have
        await blocker.rollback()
        (_, rows) = await asyncio.wait_for(waiting, timeout=20)
        assert rows[0]["taken"] is True
    finally:
        await holder.close()


async def test_only_tokens_answered_lately_are_batched_and_close_answers_everyone(
    runs: Batches, driver: Driver, sync_conn: SyncConnection
) -> None:
    """A token nobody knows never enters a batch (it would roll back everyone's); one
    whose call failed in a batch runs alone for a while; close() tells every waiting call
    that the API is going away."""
    fleet.operations(sync_conn)
    runner = await fleet.runner(driver, "known", node="node-known")
    secret = _token(sync_conn, "runner", runner)
    state = [wire.encode(runner)]
    assert not runs.batchable("fq_nobody", CHECK_ONLY, [])
    assert not runs.batchable(secret, "runners_get_state", state)  # not answered yet
    await runs.at_once(secret, "runners_get_state", state, 10)
    assert runs.batchable(secret, "runners_get_state", state)
    # a call of its that fails in a batch: the batch runs alone, the token is set aside
    failed = await asyncio.gather(
        runs.call(secret, "lease_reap", [wire.encode(10), wire.encode("2030-01-01")], 10),
        return_exceptions=True,
    )
    assert isinstance(failed[0], errors.FleetqError), failed
    assert not runs.batchable(secret, "runners_get_state", state)
    waiting = asyncio.ensure_future(runs.call(secret, "runners_get_state", state, 10))
    await asyncio.sleep(0)  # let it join the pending batch (not a synchronisation)
    await runs.close()
    with pytest.raises(errors.ConnectionFailed, match="shutting down"):
        await asyncio.wait_for(waiting, timeout=10)
