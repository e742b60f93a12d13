"""Handlers the runner tests declare as operations (imported by runner processes)."""

from __future__ import annotations

import asyncio

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
