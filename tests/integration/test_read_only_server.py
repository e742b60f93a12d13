"""A server that takes no writes (a standby, a primary fenced with
`default_transaction_read_only`) is an outage to ride out, said as such, never a bug;
a connection to one is refused by the check each pool and LISTEN session runs, unless
the DSN asked for any server (docs/operations.md, "Failover")."""

from __future__ import annotations

from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg
import pytest

from fleetq.core.db import as_uri, writable
from fleetq.core.driver import AsyncpgDriver, mapped_errors, server_guard
from fleetq.core.errors import ReadOnlyServer

READ_ONLY = {"default_transaction_read_only": "on"}


def _with(dsn: str, name: str, value: str) -> str:
    """`dsn` (a URI) with one more query parameter."""
    parts = urlsplit(as_uri(dsn))
    query = f"{parts.query}&" if parts.query else ""
    return urlunsplit(parts._replace(query=f"{query}{name}={quote(value)}"))


async def test_a_write_on_a_read_only_session_is_a_read_only_server(db_dsn: str) -> None:
    conn = await asyncpg.connect(as_uri(db_dsn), server_settings=READ_ONLY)
    try:
        with pytest.raises(ReadOnlyServer, match="read-only"), mapped_errors():
            await conn.execute("INSERT INTO fleetq.events (kind) VALUES ('x')")
    finally:
        await conn.close()


async def test_the_guard_refuses_what_the_dsn_did_not_ask_for(db_dsn: str) -> None:
    conn = await asyncpg.connect(as_uri(db_dsn), server_settings=READ_ONLY)
    try:
        read_write = server_guard(writable(as_uri(db_dsn)))
        assert read_write is not None
        with pytest.raises(ReadOnlyServer, match="default_transaction_read_only"):
            await read_write(conn)
        # `primary` skips standbys only; a read-only login on the primary is fine
        primary = server_guard(_with(db_dsn, "target_session_attrs", "primary"))
        assert primary is not None
        await primary(conn)
        assert server_guard(_with(db_dsn, "target_session_attrs", "any")) is None
    finally:
        await conn.close()
    # and a session that takes writes passes
    writable_conn = await asyncpg.connect(as_uri(db_dsn))
    try:
        assert read_write is not None
        await read_write(writable_conn)
    finally:
        await writable_conn.close()


async def test_no_server_that_takes_writes_is_said_so(db_dsn: str) -> None:
    """Every host of the DSN refuses writes: asyncpg's own check (read-write) turns it
    down, and fleetq says what that means."""
    read_only = writable(_with(db_dsn, "options", "-c default_transaction_read_only=on"))
    with pytest.raises(ReadOnlyServer, match="accepts writes"):
        await AsyncpgDriver.connect(read_only)
