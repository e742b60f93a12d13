"""Handlers that ship with fleetq (the benchmark, the example config and the demo use them)."""

from __future__ import annotations

import asyncio
import time

from fleetq.core import leasing
from fleetq.core.driver import AsyncpgDriver
from fleetq.core.errors import NotAllowed
from fleetq.runner.context import JobContext


async def noop(ctx: JobContext) -> None:
    """Do nothing: measures the queue, not the work."""


async def stamp(ctx: JobContext) -> str:
    """Answer the wall clock at the handler's first line (its log tail): the benchmarks
    (`bench/`) measure enqueue -> start on the producer's clock with it (producer and
    runner on one machine, one clock), as a user would, not from the database's
    timestamps."""
    return f"{time.time():.6f}"


async def echo(ctx: JobContext) -> str:
    """Return the payload as the log tail (handy in demos and tests)."""
    return repr(ctx.claim.payload)


async def fail(ctx: JobContext) -> None:
    """Always fail (tests and demos)."""
    raise RuntimeError(f"job {ctx.claim.job_id} failed on purpose")


async def publish(ctx: JobContext) -> str:
    """Publish to the fenced ledger, an external store that orders writes by fencing
    token: after `payload.seconds` of work, write under `payload.key` (default: the job's
    own key) presenting this execution's token. A stale holder whose write arrives after
    a newer token's is refused, and the job fails saying so; the demo counts violations
    (an accepted write behind a newer token), which must stay 0."""
    payload = ctx.claim.payload
    await asyncio.sleep(float(payload.get("seconds", 0)))
    key = str(payload.get("key") or f"job-{ctx.claim.job_id}")
    accepted = await leasing.fenced_write(
        AsyncpgDriver(ctx.pool) if ctx.pool is not None else _no_pool(),
        key=key,
        job_id=ctx.claim.job_id,
        token=ctx.claim.lease_version,
        value={"runner": ctx.runner},
    )
    if not accepted:
        raise RuntimeError(f"ledger {key} refused token {ctx.token}: a newer one wrote first")
    return f"ledger {key}: token {ctx.token} accepted"


def _no_pool() -> AsyncpgDriver:
    raise NotAllowed("publish writes the fenced ledger with a database session: it needs --dsn")
