"""The launch gate: a staged command starts only while the database says it may, and its
start is recorded in the same transaction.

Why: the check before a launch read only the execution's own stop flag, which a cancel
sets when the runner hears of it (a notification, or the next renewal). A cancel
committed but not yet heard (a notification lost with a dropped LISTEN connection, the
renewal not yet due) let the job start; it stopped again only once its start report
answered `stale` (issue 43). The gate asks the database, on one connection, in one
transaction: a fenced renewal takes the job's row (this runner's, under this token, still
claimed or running: `stale` once it was cancelled or moved on), the row is kept while the
process starts, and the start report commits with it. A cancel that arrives meanwhile
waits for that commit and finds a running job, which it stops as any other.

A runner that crashes between the launch and the commit leaves the job claimed with no
start (the server rolls the transaction back); its journal names the launch, so the
collection pass sweeps the run and reports the claim lost, as for any lost start report.
The gate is a narrowing, not a requirement: when it cannot be had (the database out of
reach, the row busy for long) the launch goes on as before, and the start report's own
fence stops a run the database no longer wants.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
from asyncpg.pool import PoolConnectionProxy
from asyncpg.transaction import Transaction

from fleetq.core import leasing, queries
from fleetq.core.driver import AsyncpgDriver, mapped_errors
from fleetq.core.errors import FleetqError
from fleetq.core.models import Claim, RunnerId

log = logging.getLogger(__name__)

# the renewal skips a row another transaction holds (a cancel committing, this runner's
# own heartbeat): asked again this many times, this far apart, before going on ungated
BUSY_TRIES = 20
BUSY_PAUSE_S = 0.05
ACQUIRE_S = 5.0


class Gate:
    """One open launch transaction holding a job's row; `driver` runs in it."""

    def __init__(
        self, conn: PoolConnectionProxy[asyncpg.Record], pool: asyncpg.Pool, tx: Transaction
    ) -> None:
        self._conn: PoolConnectionProxy[asyncpg.Record] | None = conn
        self._pool = pool
        self._tx = tx
        self.driver = AsyncpgDriver(conn)

    async def close(self, *, commit: bool) -> None:
        """Commit (the start report is in) or roll back (nothing launched), and give
        the connection back; once. A failed commit raises (the report may not be in)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            with mapped_errors():
                if commit:
                    await self._tx.commit()
                else:
                    await self._tx.rollback()
        finally:
            await self._pool.release(conn, timeout=ACQUIRE_S)


async def enter(pool: asyncpg.Pool, runner: RunnerId, claim: Claim) -> Gate | str | None:
    """Open the gate for `claim`: a `Gate` holding the job's row; or why it may not run
    ("cancelled" or "superseded"); or None when the database could not say (go on)."""
    for _ in range(BUSY_TRIES):
        try:
            answer = await _try(pool, runner, claim)
        except FleetqError as exc:
            log.warning("launch of job=%d ungated: %s", claim.job_id, exc)
            return None
        if answer != "busy":
            return answer
        await asyncio.sleep(BUSY_PAUSE_S)
    log.warning("launch of job=%d ungated: its row stayed busy", claim.job_id)
    return None


async def _try(pool: asyncpg.Pool, runner: RunnerId, claim: Claim) -> Gate | str:
    with mapped_errors():
        conn = await pool.acquire(timeout=ACQUIRE_S)
    try:
        with mapped_errors():
            tx = conn.transaction()
            await tx.start()
        gate = Gate(conn, pool, tx)
    except BaseException:
        await pool.release(conn, timeout=ACQUIRE_S)
        raise
    try:
        (renewal,) = await leasing.heartbeat(
            gate.driver, runner=runner, leases=[(claim.job_id, claim.lease_version)]
        )
        if renewal.status == "ok":
            return gate
        why = "busy" if renewal.status == "busy" else await _why_not(gate, runner, claim)
    except BaseException:
        await gate.close(commit=False)
        raise
    await gate.close(commit=renewal.status == "stale")  # keep the stale rejection's record
    return why


async def _why_not(gate: Gate, runner: RunnerId, claim: Claim) -> str:
    rows = await gate.driver.fetch(queries.sql("lease_job_states"), runner, [claim.job_id])
    return "cancelled" if rows and rows[0]["state"] == "cancelled" else "superseded"
