"""What an in-process handler receives: its job, its fencing token, and a way to write
to the database that commits only while this runner still holds the lease."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from fleetq.core import queries
from fleetq.core.driver import map_error, mapped_errors
from fleetq.core.errors import ConnectionFailed, NotAllowed, StaleLease
from fleetq.core.models import Claim, RunnerId
from fleetq.runner.loops import Backoff

log = logging.getLogger(__name__)
Connection: TypeAlias = "PoolConnectionProxy[asyncpg.Record]"
FINISH_CHECKS = 5  # tries to read back an outcome whose commit reply was lost


@dataclass
class JobContext:
    """Handed to `async def handler(ctx)`."""

    claim: Claim
    runner: RunnerId
    pool: asyncpg.Pool | None  # None: served through the API, no session to lend
    # how many `transaction()` blocks are open: each holds the job's row, which the
    # runner's heartbeat then skips rather than waits for (and counts as held)
    transactions_open: int = 0
    # the trace context to continue: the runner's run span when spans are on
    # (runner/tracing.py), else the one the job was submitted with
    trace_header: str | None = None
    # told of a renewal made inside a transaction: (when it was sent, on
    # `time.monotonic()`; the lease's seconds left)
    renewed: Callable[[float, float | None], None] = lambda _sent, _left: None
    # what the verdict rests on (runner/provenance.py): an outcome written in the
    # handler's own transaction carries it too
    provenance: dict[str, Any] | None = None

    @property
    def token(self) -> int:
        """The fencing token: present it to external resources that order writes."""
        return int(self.claim.lease_version)

    @property
    def traceparent(self) -> str | None:
        """The W3C trace context to continue: the runner's span for this run when it
        traces, else the one the job was submitted with."""
        return self.trace_header or self.claim.traceparent

    @contextlib.asynccontextmanager
    async def transaction(self, *, finish: bool = False) -> AsyncIterator[Connection]:
        """A transaction that first locks this job's row under our (owner, token).

        While it is open nobody can take the lease (the reaper and claims wait on the row
        lock), so what it writes commits only if we still hold the lease; if we no longer
        do, `StaleLease` is raised before anything is written. That is at most once *per
        lease*: a later execution under a newer token may do it again.

        With `finish=True` the job's successful outcome is written in this same
        transaction, which makes the effect exactly-once: either both commit or neither
        does, and no later lease exists once the outcome has committed. The runner's own
        outcome write afterwards is then answered `already`.

        The connection comes from the runner's pool, which does not reset sessions on
        release (a round trip per call otherwise): use `SET LOCAL`, never a plain `SET`,
        and leave no LISTEN or session advisory lock behind.

        A lost connection raises `ConnectionFailed` (not asyncpg's own errors), which the
        runner reports as a lost run: requeued once, not failed. With `finish=True`, a
        connection lost at commit is resolved by reading the job back: if the outcome
        committed, the block simply succeeded.
        """
        body_done = False
        self.transactions_open += 1
        try:
            async with self._transaction(finish=finish) as conn:
                yield conn
                body_done = True
        except ConnectionFailed as lost:
            if finish and body_done and await self._finished_here():
                log.warning(
                    "job=%d token=%d: connection lost at commit, but the outcome committed (%s)",
                    self.claim.job_id,
                    self.token,
                    lost,
                )
                return
            raise
        finally:
            self.transactions_open -= 1

    async def _finished_here(self) -> bool:
        """Whether this execution's `finish=True` outcome is in the database (asked a
        few times: the connection was just lost, the server may be restarting)."""
        backoff = Backoff()
        for _ in range(FINISH_CHECKS):
            try:
                assert self.pool is not None  # a transaction was had
                row = await self.pool.fetchrow(
                    queries.sql("lease_job_states"), self.runner, [self.claim.job_id]
                )
            except Exception as exc:
                if map_error(exc) is None:
                    raise
                await backoff.sleep()
                continue
            return bool(
                row is not None
                and row["state"] == "succeeded"
                and row["lease_version"] == self.claim.lease_version
            )
        return False

    @contextlib.asynccontextmanager
    async def _transaction(self, *, finish: bool) -> AsyncIterator[Connection]:
        if self.pool is None:
            raise NotAllowed(
                "ctx.transaction() needs a database session, and this runner is served "
                "through the API (fleetq-runner --api): run this operation's lane on a "
                "runner with a DSN"
            )
        async with contextlib.AsyncExitStack() as stack:
            try:
                conn = await stack.enter_async_context(self.pool.acquire())
            except Exception as exc:
                # no connection to be had (the server is restarting: "cannot connect now"):
                # the same for the handler as a lost one, so it runs again, not fails
                if isinstance(map_error(exc), ConnectionFailed):
                    raise ConnectionFailed(
                        f"the handler's database connection could not be made: {exc}"
                    ) from exc
                raise
            try:
                async with conn.transaction():
                    with mapped_errors():  # fleetq's own statements: a lock timeout is
                        locked = await self._lock(conn)  # DatabaseBusy, run again
                    failed: Exception | None = None
                    try:
                        # the handler's writes in a savepoint, so that the renewal below
                        # commits whether they do or not
                        async with conn.transaction():
                            yield locked
                            if finish:
                                with mapped_errors():
                                    await self._finish(conn)
                    except Exception as exc:
                        failed = exc
                    if failed is not None or not finish:
                        with mapped_errors():
                            await self._renew(conn)
                if failed is not None:
                    raise failed
            except Exception as exc:
                # Only the loss of this transaction's own connection is fleetq's to
                # explain; whatever else the handler's code raises passes through as is.
                if _closed(conn):
                    raise ConnectionFailed(
                        f"the handler's database connection was lost: {exc}"
                    ) from exc
                raise

    async def _lock(self, conn: Connection) -> Connection:
        """Lock the job's row under our (owner, token), or raise `StaleLease`."""
        held = await conn.fetchval(
            queries.sql("lease_lock_for_handler"),
            self.claim.job_id,
            self.runner,
            self.claim.lease_version,
        )
        if held is None:
            raise StaleLease(self.claim.job_id, self.claim.lease_version, "handler write")
        return conn

    async def _renew(self, conn: Connection) -> None:
        """Renew the lease in this transaction, which holds the job's row. Renewals sent
        while it did skipped the row and answered busy: they did not extend the lease,
        which may have run out meanwhile (nobody could take it while the row was held).
        Renewed before the row is let go, the lease is current the moment another
        runner's reaper could see it (issue 43, finding 1)."""
        sent = time.monotonic()
        (row,) = await conn.fetch(
            queries.sql("lease_heartbeat"), self.runner, [self.claim.job_id], [self.token]
        )
        if row["status"] == "ok":
            self.renewed(sent, row["lease_left_s"])

    async def _finish(self, conn: Connection) -> None:
        """The job's successful outcome, in the handler's transaction."""
        await conn.fetch(
            queries.sql("lease_complete"),
            self.runner,
            [self.claim.job_id],
            [self.claim.lease_version],
            ["succeeded"],
            [0],
            [None],
            ["finished in the handler's transaction"],
            [None],
            [None],
            [0],  # it ends with this commit: a measured end, now
            [json.dumps(self.provenance) if self.provenance is not None else None],
        )


def _closed(conn: Connection) -> bool:
    """Whether the transaction's connection is gone. A pool detaches the proxy of a
    connection that closed under it, and then even asking raises."""
    try:
        return conn.is_closed()
    except asyncpg.InterfaceError:
        return True
