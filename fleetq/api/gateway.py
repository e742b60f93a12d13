"""The API's way into the database: a pool, and one transaction per request that acts
for the request's token.

The token goes to the database as it was sent (`fleetq.token`, transaction-local) and
the protocol resolves it (protocol/roles.sql, fleetq.caller), so the API server never
decides who a caller is or what it may do: a submitter token submits as its identity and
cancels only its own jobs over HTTP exactly as a submitter login does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
from collections.abc import AsyncIterator
from typing import Annotated

import asyncpg
from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from fleetq.api.models import Caller
from fleetq.core import migrate, queries
from fleetq.core.db import as_uri
from fleetq.core.driver import (
    AsyncpgDriver,
    connect_each_host,
    mapped_errors,
    prepare_asyncpg,
    server_guard,
)
from fleetq.core.errors import ConnectionFailed, DatabaseBusy, FleetqError, NotAuthenticated
from fleetq.core.models import JobId

_bearer = HTTPBearer(auto_error=False, description="a token from `fleetq tokens add`")
Token = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]

ACQUIRE_TIMEOUT_S = 10.0

log = logging.getLogger("fleetq.api")


class Gateway:
    """A connection pool whose connections act only for a presented token."""

    def __init__(
        self,
        dsn: str,
        *,
        pool_size: int = 10,
        pgbouncer: bool = False,
        session_dsn: str | None = None,
    ) -> None:
        self.dsn = dsn
        self.pool_size = pool_size
        # through PgBouncer in transaction mode: no prepared statement outlives its
        # transaction (each request is one), so asyncpg keeps none (statement cache off)
        self.pgbouncer = pgbouncer
        # what needs a session of its own (the one LISTEN connection of `notices`): PgBouncer
        # in transaction mode cannot carry LISTEN, so it goes straight to PostgreSQL
        self.session_dsn = session_dsn or dsn
        self._pool: asyncpg.Pool | None = None
        self._waiting: asyncio.Task[None] | None = None  # the schema check, deferred

    async def open(self) -> None:
        """Open the pool and refuse a schema that is not this code's (as every fleetq
        process does at start), so a wrong database fails now, not at the first call."""
        with mapped_errors():
            self._pool = await asyncpg.create_pool(
                as_uri(self.dsn),
                connect=functools.partial(connect_each_host, read_committed=not self.pgbouncer),
                min_size=0,
                max_size=self.pool_size,
                init=prepare_asyncpg,
                setup=server_guard(self.dsn),
                server_settings={"application_name": "fleetq-api"},
                statement_cache_size=0 if self.pgbouncer else 100,
                reset=_nothing_to_reset,
            )
        try:
            await migrate.require_current_async(AsyncpgDriver(self._pool))
        except (ConnectionFailed, DatabaseBusy) as exc:
            # a service started before its database answers (or while it restarts):
            # every call answers 503 meanwhile, and the schema is checked once it answers
            log.warning("the database is out of reach (%s); answering 503 until it is back", exc)
            self._waiting = asyncio.create_task(self._check_when_back(), name="schema check")

    async def _check_when_back(self) -> None:
        """Check the schema once the database answers; a schema that is not this code's
        stops the API, as it would have at start."""
        backoff = 0.5
        while True:
            await asyncio.sleep(backoff)
            try:
                await migrate.require_current_async(AsyncpgDriver(self.pool))
            except (ConnectionFailed, DatabaseBusy):
                backoff = min(5.0, backoff * 2)
                continue
            except FleetqError as exc:
                log.critical("%s; stopping", exc)
                os.kill(os.getpid(), signal.SIGTERM)
                return
            log.info("the database answers again")
            return

    async def close(self) -> None:
        if self._waiting is not None:
            self._waiting.cancel()
        if self._pool is not None:
            await AsyncpgDriver(self._pool).close()

    @property
    def pool(self) -> asyncpg.Pool:
        assert self._pool is not None, "Gateway.open() first"
        return self._pool

    @contextlib.asynccontextmanager
    async def acting(self, token: str | None) -> AsyncIterator[tuple[AsyncpgDriver, Caller]]:
        """A driver whose calls act for the holder of `token`, in one transaction that
        commits when the block ends without an error; refused (`NotAuthenticated`) with
        no token, or an unknown or revoked one."""
        if not token:
            raise NotAuthenticated("an API token is required: Authorization: Bearer <token>")
        async with self.transaction() as driver:
            rows = await driver.fetch(queries.sql("tokens_act_for"), token)
            yield driver, Caller(kind=rows[0]["kind"], identity=rows[0]["subject"])

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncpgDriver]:
        """One transaction of the pool's, acting for nobody until told whom
        (`tokens_act_for`: a gateway login may do nothing else); commits when the block
        ends without an error."""
        with mapped_errors():
            async with (
                self.pool.acquire(timeout=ACQUIRE_TIMEOUT_S) as conn,
                # asked here, not at connect: PgBouncer forwards no startup setting
                conn.transaction(isolation="read_committed"),
            ):
                yield AsyncpgDriver(conn)

    async def schema_version(self) -> int:
        """The database's schema version: what health answers, reachable or not."""
        rows = await AsyncpgDriver(self.pool).fetch(queries.sql("migrate_applied"), timeout=5)
        return max((int(r["version"]) for r in rows), default=0)


async def _nothing_to_reset(_conn: object) -> None:
    """A pool connection of the API's is used for one transaction at a time, whose setting
    (`fleetq.token`) is its own (`set_config(..., true)`), with no LISTEN, cursor or session
    lock (asyncpg still rolls back a transaction left open). Its default reset (advisory
    unlock, CLOSE ALL, UNLISTEN, RESET ALL) was one statement more per request, and through
    PgBouncer a transaction of its own on whichever server connection it reached."""


@contextlib.asynccontextmanager
async def savepoint(driver: AsyncpgDriver) -> AsyncIterator[None]:
    """A part of a request's transaction whose failure undoes only itself: a failed
    statement would otherwise doom the whole transaction, the request's writes too."""
    conn = driver.conn
    assert not isinstance(conn, asyncpg.Pool), "a savepoint is one connection's"
    with mapped_errors():
        async with conn.transaction():
            yield


def job_path(job_id: JobId) -> str:
    return f"/v1/jobs/{job_id}"
