"""A real PostgreSQL for the whole test session, and cheap isolation per test.

- The server: `FLEETQ_TEST_DSN` when set (any database on the server; we create our
  own), else an embedded PostgreSQL started in a temporary home for this session. A
  server that does not answer fails the session: tests never skip for lack of one.
- A template database migrated once by `fleetq migrate`'s own code; each test that needs
  its own database (several connections, DDL, concurrency) gets a clone of it.
- `tx`: a connection to a shared clone, inside a transaction rolled back after the test,
  for the many tests that need one connection only.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

from fleetq.core import migrate
from fleetq.core.db import SyncConnection, connect, with_database
from fleetq.core.driver import Driver, open_driver
from fleetq.core.embedded import EmbeddedServer
from tests import stamps

# Test-only settings: durability is not what these tests measure.
FAST = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
}
_counter = itertools.count()


def make_home() -> Path:
    """A fresh FLEETQ_HOME that the server user can reach when tests run as root."""
    home = Path(tempfile.mkdtemp(prefix="fleetq-test-"))
    home.chmod(0o755)
    return home


@contextlib.contextmanager
def embedded_server() -> Iterator[str]:
    """An embedded PostgreSQL in a fresh home, for as long as the block runs: the DSN of
    its maintenance database (the test session's server; scripts/mutants.py's too)."""
    home = make_home()
    server = EmbeddedServer(home, settings=FAST)
    try:
        status = server.ensure_running()
        assert status.dsn is not None
        yield with_database(status.dsn, "postgres")
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    """A DSN for the test server's maintenance database."""
    if dsn := os.environ.get("FLEETQ_TEST_DSN"):
        try:
            psycopg.connect(dsn, connect_timeout=10).close()
        except psycopg.Error as exc:
            pytest.fail(f"FLEETQ_TEST_DSN does not answer: {exc}", pytrace=False)
        yield dsn
        return
    with embedded_server() as dsn:
        yield dsn


def _admin(server_dsn: str, statement: bytes) -> None:
    with psycopg.connect(server_dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(statement)


def create_database(server_dsn: str, template: str | None = None) -> str:
    """A new database (cloned from `template` when given); returns its name."""
    name = f"fleetq_test_{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}"
    clause = f' TEMPLATE "{template}"' if template else ""
    _admin(server_dsn, f'CREATE DATABASE "{name}"{clause}'.encode())
    return name


def drop_database(server_dsn: str, name: str) -> None:
    """Drop a test database, disconnecting whoever is still on it."""
    _admin(server_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


@pytest.fixture(scope="session")
def template_db(server_dsn: str) -> Iterator[str]:
    """The name of a database migrated once per session; never connected to by tests."""
    name = create_database(server_dsn)
    migrate.migrate(with_database(server_dsn, name))
    yield name
    drop_database(server_dsn, name)


@pytest.fixture
def db_dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database of this test's own."""
    name = create_database(server_dsn, template_db)
    dsn = with_database(server_dsn, name)
    yield dsn
    try:
        if found := stamps.future_stamps(dsn):
            pytest.fail(f"{stamps.FAILURE}: {found}", pytrace=False)
    finally:
        drop_database(server_dsn, name)


@pytest.fixture
def demo_dsn(server_dsn: str, db_dsn: str) -> Iterator[str]:
    """The database `fleetq --dsn DB_DSN demo` runs in, as the README documents it: on
    the same server, `db_dsn`'s name with `_demo` added (spelled out here, not asked of
    the code under test). Dropped after the test, whoever made it."""
    from psycopg.conninfo import conninfo_to_dict

    name = f"{conninfo_to_dict(db_dsn)['dbname']}_demo"
    yield with_database(server_dsn, name)
    drop_database(server_dsn, name)


@pytest.fixture
def empty_dsn(server_dsn: str) -> Iterator[str]:
    """A fresh database with no fleetq schema at all."""
    name = create_database(server_dsn)
    yield with_database(server_dsn, name)
    drop_database(server_dsn, name)


@pytest.fixture(scope="session")
def shared_dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """A migrated database shared by `tx` tests (each rolls its work back)."""
    name = create_database(server_dsn, template_db)
    yield with_database(server_dsn, name)
    drop_database(server_dsn, name)


@pytest.fixture
def tx(shared_dsn: str) -> Iterator[SyncConnection]:
    """One connection inside a transaction that is rolled back after the test."""
    with connect(shared_dsn) as conn:
        # Open the transaction now, so code under test that uses conn.transaction() gets a
        # savepoint inside it instead of committing a transaction of its own.
        conn.execute("SELECT 1")
        try:
            yield conn
        finally:
            conn.rollback()


@pytest.fixture
async def driver(db_dsn: str) -> AsyncIterator[Driver]:
    """An asyncpg driver on a fresh database (the runner's and console's driver)."""
    async with open_driver(db_dsn, kind="asyncpg") as drv:
        yield drv


@pytest.fixture
def sync_conn(db_dsn: str) -> Iterator[SyncConnection]:
    """An autocommit psycopg connection on the same fresh database, for factories."""
    with connect(db_dsn, autocommit=True) as conn:
        yield conn
