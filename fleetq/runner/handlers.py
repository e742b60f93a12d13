"""Handlers that ship with fleetq (the benchmark and the example config use them)."""

from __future__ import annotations

from fleetq.runner.context import JobContext


async def noop(ctx: JobContext) -> None:
    """Do nothing: measures the queue, not the work."""


async def echo(ctx: JobContext) -> str:
    """Return the payload as the log tail (handy in demos and tests)."""
    return repr(ctx.claim.payload)


async def fail(ctx: JobContext) -> None:
    """Always fail (tests and demos)."""
    raise RuntimeError(f"job {ctx.claim.job_id} failed on purpose")
