"""The driver seam: a few async methods, two implementations, errors mapped at the edge.

Runners and the console speak asyncpg; the CLI and producers speak psycopg 3. Both run
the same `$n` SQL blocks (psycopg through `AsyncRawCursor`), and both return rows as
plain dicts with JSON already decoded, so everything above this module is driver-blind.
Every call carries a client timeout: a wedged server surfaces as `QueryTimeout`, never
as a hang. The classes here hold no business logic.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, LiteralString, Protocol, TypeAlias

import asyncpg
import psycopg
from asyncpg.pool import PoolConnectionProxy
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads

from fleetq.core import errors
from fleetq.core.db import (
    READ_COMMITTED,
    READ_COMMITTED_OPTION,
    as_uri,
    busy,
    dsn_settings,
    each_host,
    misnamed,
    read_json,
    read_only_message,
    target_session_attrs,
)

DEFAULT_TIMEOUT_S = 30.0


class Driver(Protocol):
    """What the queue needs from a connection."""

    async def fetch(
        self, query: LiteralString, *args: object, timeout: float = DEFAULT_TIMEOUT_S
    ) -> list[dict[str, Any]]:
        """Run one statement; return its rows."""
        ...

    async def close(self) -> None:
        """Close the connection."""
        ...


def map_error(exc: BaseException) -> errors.FleetqError | None:
    """The fleetq error for a driver exception, or None when it is not a database error
    (a fleetq error, raised inside a driver call such as a pool's `setup`, is its own)."""
    if isinstance(exc, errors.FleetqError):
        return exc
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate in errors.BY_SQLSTATE:
        return errors.BY_SQLSTATE[sqlstate](_primary_message(exc))
    if isinstance(exc, TimeoutError):
        return errors.QueryTimeout()
    if sqlstate == "25006":  # read_only_sql_transaction: a standby, or a demoted primary
        return errors.ReadOnlyServer(read_only_message(_primary_message(exc)))
    if isinstance(exc, asyncpg.exceptions.TargetServerAttributeNotMatched):
        return errors.ReadOnlyServer(
            f"no server in the DSN accepts writes ({exc}): a failover is under way, or the "
            "primary is not among the DSN's hosts"
        )
    if busy(sqlstate):
        return errors.DatabaseBusy(f"database busy: {_primary_message(exc)}")
    if isinstance(exc, ValueError):
        # asyncpg's DataError and ClientConfigurationError: arguments fleetq passed
        # wrongly, checked before anything was sent. A bug, never retried as an outage.
        return None
    if misnamed(exc):  # the DSN is wrong: retrying will not help
        return errors.ConfigError(f"the DSN names what the server does not have: {exc}")
    # InternalClientError: asyncpg's protocol state after a connection broke mid-call
    # ("cannot switch to state 12; another operation is in progress"), seen during a
    # server restart; the connection is unusable, like a lost one.
    connection_lost = isinstance(
        exc,
        OSError
        | asyncpg.InterfaceError
        | asyncpg.PostgresConnectionError
        | asyncpg.exceptions.InternalClientError
        | psycopg.OperationalError,
    ) or (isinstance(sqlstate, str) and sqlstate[:2] in ("08", "57"))
    if connection_lost:
        return errors.ConnectionFailed(f"database unreachable or connection lost: {exc}")
    if isinstance(exc, asyncpg.PostgresError | psycopg.Error):
        return errors.FleetqError(f"database error: {_primary_message(exc)}")
    return None


@contextlib.contextmanager
def mapped_errors() -> Iterator[None]:
    """Re-raise driver exceptions as `core.errors`, with the original chained."""
    try:
        yield
    except Exception as exc:
        mapped = map_error(exc)
        if mapped is None or mapped is exc:
            raise
        raise mapped from exc


def _primary_message(exc: BaseException) -> str:
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) or getattr(exc, "message", None)
    return str(primary or exc)


async def connect_each_host(
    dsn: str | None = None, *, read_committed: bool = True, **kwargs: Any
) -> asyncpg.Connection:
    """`asyncpg.connect`, trying the DSN's hosts one at a time, each with the whole
    `timeout` (a pool takes it as `connect=`).

    Why: asyncpg spends one timeout on its whole host list, and leaves a host for the
    next only when it refuses at once. A primary whose machine froze (no reply, no
    refusal) held every connection attempt until the timeout, and the standby listed
    after it was never tried. libpq gives each host a timeout of its own; so does this.

    `read_committed=False`: no isolation level asked at start-up, for PgBouncer, which
    forwards no such parameter (the API then asks for it in each transaction)."""
    assert dsn is not None
    named = dsn_settings(dsn)
    asked = READ_COMMITTED if read_committed else {}
    settings = {k: v for k, v in asked.items() if k not in named}
    kwargs["server_settings"] = {**settings, **(kwargs.get("server_settings") or {})}
    last: Exception | None = None
    for one in each_host(as_uri(dsn)):
        try:
            return await asyncpg.connect(one, **kwargs)
        except (ValueError, asyncpg.ClientConfigurationError):
            raise  # the DSN or the call is wrong: the next host would not fix it
        except Exception as exc:  # a host down, frozen, starting, or not writable
            last = exc
    assert last is not None
    raise last


class AsyncpgDriver:
    """asyncpg, for runners and the console: one connection, or a pool (each call then
    takes a connection for one statement)."""

    def __init__(
        self, conn: asyncpg.Connection | asyncpg.Pool | PoolConnectionProxy[asyncpg.Record]
    ) -> None:
        self.conn = conn

    @classmethod
    async def connect(cls, dsn: str, *, timeout: float = 10.0) -> AsyncpgDriver:
        """Open a connection with JSON codecs, so rows come back decoded."""
        with mapped_errors():
            conn = await connect_each_host(dsn, timeout=timeout)
            await prepare_asyncpg(conn)
        return cls(conn)

    async def fetch(
        self, query: LiteralString, *args: object, timeout: float = DEFAULT_TIMEOUT_S
    ) -> list[dict[str, Any]]:
        """Run one statement; return its rows as dicts."""
        with mapped_errors():
            if isinstance(self.conn, asyncpg.Pool):
                # a pool may have to open a connection first: bound that wait too
                async with self.conn.acquire(timeout=timeout) as conn:
                    rows = await conn.fetch(query, *args, timeout=timeout)
            else:
                rows = await self.conn.fetch(query, *args, timeout=timeout)
        return [dict(row) for row in rows]

    async def close(self) -> None:
        """Close the connection or pool (never raises on an already broken one)."""
        with contextlib.suppress(Exception):
            if isinstance(self.conn, asyncpg.Pool):
                await asyncio.wait_for(self.conn.close(), 5)
            else:
                await self.conn.close(timeout=5)


_AnyConnection: TypeAlias = "asyncpg.Connection | PoolConnectionProxy[asyncpg.Record]"
ServerGuard: TypeAlias = Callable[[_AnyConnection], Coroutine[Any, Any, None]]

# What each `target_session_attrs` asks of a server, as the server reports it.
_REFUSED_WHEN_ON = {
    "read-write": ("in_hot_standby", "default_transaction_read_only"),
    "primary": ("in_hot_standby",),
}


def server_guard(dsn: str) -> ServerGuard | None:
    """A check that a connection's server is still the kind the DSN asked for (None when
    it asked for any): a pool's `setup`, run at each acquire, and the LISTEN sessions'
    periodic check. A server demoted, or fenced by an operator with
    `default_transaction_read_only`, stays reachable while it refuses every write (and a
    LISTEN there hears no submit): the check fails the call as `ReadOnlyServer` and the
    connection is closed, so the next one (made with the DSN's `target_session_attrs`)
    finds the primary. Free: the settings are reported by the server (PostgreSQL 14+),
    not queried."""
    names = _REFUSED_WHEN_ON.get(target_session_attrs(dsn))
    if names is None:
        return None

    async def guard(conn: _AnyConnection) -> None:
        settings = conn.get_settings()
        for name in names:
            if getattr(settings, name, "off") == "on":
                raise errors.ReadOnlyServer(
                    read_only_message(f"{name} is on at the server this connection reached")
                )

    return guard


async def prepare_asyncpg(conn: asyncpg.Connection) -> None:
    """Decode json/jsonb to Python values on an asyncpg connection (pools call this too)."""
    for name in ("json", "jsonb"):
        await conn.set_type_codec(name, encoder=json.dumps, decoder=read_json, schema="pg_catalog")


class PsycopgDriver:
    """psycopg 3 (async), for the CLI and for producers."""

    def __init__(self, conn: psycopg.AsyncConnection[dict[str, Any]]) -> None:
        self.conn = conn

    @classmethod
    async def connect(cls, dsn: str, *, timeout: float = 10.0) -> PsycopgDriver:
        """Open an autocommit connection: each protocol call is its own transaction."""
        with mapped_errors():
            conn = await psycopg.AsyncConnection.connect(
                dsn,
                autocommit=True,
                connect_timeout=max(1, int(timeout)),
                row_factory=dict_row,
                cursor_factory=psycopg.AsyncRawCursor,
                application_name="fleetq",
                options=READ_COMMITTED_OPTION,
            )
        set_json_loads(read_json, conn)
        return cls(conn)

    async def fetch(
        self, query: LiteralString, *args: object, timeout: float = DEFAULT_TIMEOUT_S
    ) -> list[dict[str, Any]]:
        """Run one statement; return its rows as dicts."""
        with mapped_errors():
            async with asyncio.timeout(timeout):
                cursor = await self.conn.execute(query, list(args))
                return await cursor.fetchall() if cursor.description else []

    async def close(self) -> None:
        """Close the connection."""
        with contextlib.suppress(Exception):
            await self.conn.close()


@contextlib.asynccontextmanager
async def open_driver(dsn: str, *, kind: str = "psycopg") -> AsyncIterator[Driver]:
    """A driver for one piece of work, closed afterwards."""
    driver: Driver
    if kind == "asyncpg":
        driver = await AsyncpgDriver.connect(dsn)
    else:
        driver = await PsycopgDriver.connect(dsn)
    try:
        yield driver
    finally:
        await driver.close()
