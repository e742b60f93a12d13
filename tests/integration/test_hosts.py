"""A host that hangs (accepts, never answers: a frozen machine, a partition that drops
packets) listed before a good one: asyncpg spends its one timeout on the first host and
never tries the next, so fleetq's asyncpg processes connect host by host, each with a
timeout of its own (`connect_each_host`), as libpq does. The whole failover is
tests/faults/test_failover.py::test_runners_pass_over_a_primary_that_hangs (opt-in: it
waits out the runners' call timeouts)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from psycopg.conninfo import conninfo_to_dict

from fleetq.core.driver import AsyncpgDriver, connect_each_host


@pytest.fixture
async def hung_port() -> AsyncIterator[int]:
    """A TCP port that accepts connections and never says a word."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


def _hung_first(dsn: str, port: int) -> str:
    params = conninfo_to_dict(dsn)
    host, real_port = params.get("host") or "localhost", params.get("port") or "5432"
    return (
        f"postgresql://{params.get('user', 'postgres')}@/{params['dbname']}"
        f"?host=127.0.0.1,{host}&port={port},{real_port}"
    )


async def test_a_host_that_hangs_is_passed_over_for_the_next(db_dsn: str, hung_port: int) -> None:
    dsn = _hung_first(db_dsn, hung_port)
    conn = await connect_each_host(dsn, timeout=1)
    try:
        database = conninfo_to_dict(db_dsn)["dbname"]
        assert await conn.fetchval("SELECT current_database()") == database
    finally:
        await conn.close()
    driver = await AsyncpgDriver.connect(dsn, timeout=1)  # what the CLI's asyncpg paths use
    await driver.close()
