"""Handlers the runner tests declare as operations (imported by runner processes)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fleetq.core import leasing
from fleetq.core.driver import AsyncpgDriver
from fleetq.runner.context import JobContext


async def record_effect(ctx: JobContext) -> str:
    """Write an effect in a transaction fenced by the lease."""
    async with ctx.transaction() as conn:
        await conn.execute(
            "INSERT INTO effects (job_id, token) VALUES ($1, $2)", ctx.claim.job_id, ctx.token
        )
    return f"effect written under token {ctx.token}"


async def wait_forever(ctx: JobContext) -> None:
    """Runs until stopped (cancel, lease loss, shutdown)."""
    await asyncio.Event().wait()


async def until_file(ctx: JobContext) -> str:
    """Runs until the file its payload names exists (the test ends it when it wants)."""
    path = Path(str(ctx.claim.payload["path"]))
    # a file another process makes: nothing here to wait on but its appearance
    while not await asyncio.to_thread(path.exists):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    return f"{path.name} appeared"


async def record_effect_exactly_once(ctx: JobContext) -> str:
    """Write the effect and the outcome in one transaction, then fail: the failure must
    not undo or overwrite what committed."""
    async with ctx.transaction(finish=True) as conn:
        await conn.execute(
            "INSERT INTO effects (job_id, token) VALUES ($1, $2)", ctx.claim.job_id, ctx.token
        )
    raise RuntimeError("crash after the transaction committed")


async def effect_then_stall(ctx: JobContext) -> str:
    """Write the effect and the outcome in one transaction; under token 1, stall inside
    it (`pg_sleep`) so that a test can cut its connection before it commits."""
    async with ctx.transaction(finish=True) as conn:
        await conn.execute(
            "INSERT INTO effects (job_id, token) VALUES ($1, $2)", ctx.claim.job_id, ctx.token
        )
        if ctx.token == 1:
            await conn.execute("SELECT pg_sleep(60)")
    return f"effect written under token {ctx.token}"


_stalled: set[tuple[int, int]] = set()  # (job, token) runs that stalled, in this runner


async def effect_then_stall_once(ctx: JobContext) -> str:
    """As `effect_then_stall`, but only the first run under a token stalls: a handler
    run again in place (same token) then goes through."""
    async with ctx.transaction(finish=True) as conn:
        await conn.execute(
            "INSERT INTO effects (job_id, token) VALUES ($1, $2)", ctx.claim.job_id, ctx.token
        )
        if (ctx.claim.job_id, ctx.token) not in _stalled:
            _stalled.add((ctx.claim.job_id, ctx.token))
            await conn.execute("SELECT pg_sleep(60)")
    return f"effect written under token {ctx.token}"


async def own_oserror(ctx: JobContext) -> None:
    """A handler failing with an OSError of its own (not a lost database connection)."""
    raise FileNotFoundError(f"job {ctx.claim.job_id}: /no/such/file")


async def hold_transaction(ctx: JobContext) -> str:
    """Keep `ctx.transaction()` (and so the job's row) for `payload.seconds`, then write
    the effect: a long handler transaction, as real handlers have."""
    async with ctx.transaction() as conn:
        await asyncio.sleep(float(ctx.claim.payload.get("seconds", 0)))
        await conn.execute(
            "INSERT INTO effects (job_id, token) VALUES ($1, $2)", ctx.claim.job_id, ctx.token
        )
    return f"effect written under token {ctx.token}"


async def hold_then_run(ctx: JobContext) -> str:
    """Hold `ctx.transaction()` for `payload.hold` seconds, write the effect, then run on
    for `payload.after` seconds: the renewals sent while it held the row were answered
    busy, and the lease must still be current when the row is let go (issue 43)."""
    async with ctx.transaction() as conn:
        await asyncio.sleep(float(ctx.claim.payload.get("hold", 0)))
        await conn.execute(
            "INSERT INTO effects (job_id, token) VALUES ($1, $2)", ctx.claim.job_id, ctx.token
        )
    await asyncio.sleep(float(ctx.claim.payload.get("after", 0)))
    return f"effect written under token {ctx.token}"


async def effect_and_ledger(ctx: JobContext) -> str:
    """The fault suite's handler job: write the fenced ledger under the job's key, then
    the in-database effect in the outcome's own transaction (so: exactly once)."""
    assert ctx.pool is not None, "a runner with a DSN"
    await leasing.fenced_write(
        AsyncpgDriver(ctx.pool),
        key=f"job-{ctx.claim.job_id}",
        job_id=ctx.claim.job_id,
        token=ctx.claim.lease_version,
        value={"runner": ctx.runner},
    )
    async with ctx.transaction(finish=True) as conn:
        await conn.execute(
            "INSERT INTO effects (job_id, token) VALUES ($1, $2)", ctx.claim.job_id, ctx.token
        )
    return f"effect written under token {ctx.token}"
