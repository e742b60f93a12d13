"""The demo's own database, and the lock that lets one demo at a time run in it.

Why a database of its own: the demo applies settings made for a show (a 3 s lease, runners
offline after 5 s), registers runners and submits jobs. In the user's database (`fleetq`
on the embedded server, which every fleetq command uses when no DSN is given) those
settings reached the user's own runners and the user's runners claimed the demo's jobs
(issue 42). So the demo runs on the same server as the DSN it is given (or the embedded
server's), in a database named after that one with `_demo` added (`fleetq_demo` for the
embedded server's `fleetq`), created on first use; nothing of it is ever written to the
database the DSN names. `fleetq demo --reset` resets that database only.

Why this lock: a second demo in the same database would start runners with the same ids
beside the first's. The lock was an advisory key, which any login may take (issue 41's
rule: no coordination lock a login that is not fleetq's can take). Now it is an
EXCLUSIVE table lock, held by a session of the demo for the whole run, on a table of a
schema of the demo's own on which no other role has a privilege, in a database no other
role may connect to. It goes with the session, so a demo killed with SIGKILL leaves
nothing held. A second demo meets it held and is refused at once (`RefusedNow`, exit 75).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
from psycopg import sql as pgsql

from fleetq.core.db import SyncConnection, connect, with_database
from fleetq.core.errors import MigrationError, PermissionDenied, RefusedNow
from fleetq.core.queries import Library

SQL = Library("fleetq.demo.sql")
SUFFIX = "_demo"
NAME_BYTES = 63  # PostgreSQL cuts longer identifiers, which could name the user's database
_BOOTSTRAP_ATTEMPTS = 5
# a first run racing another on CREATE DATABASE or CREATE SCHEMA: the other one made it
_RACES = (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateDatabase)
_BOOTSTRAP_RACES = (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateSchema)


@dataclass(frozen=True)
class DemoDatabase:
    """Where a demo runs: `name` on the server of the DSN it was given, reached by `dsn`;
    `given` is the database that DSN names, which the demo never writes to."""

    given: str
    name: str
    dsn: str
    created: bool = False  # made by this run (the demo's files of an older one are stale)


def demo_name(given: str) -> str:
    """The demo database's name for the database `given`: `given_demo`, shortened (with
    a hash of `given`, so two long names stay apart) where PostgreSQL would cut it."""
    name = given + SUFFIX
    if len(name.encode()) <= NAME_BYTES:
        return name
    digest = hashlib.sha256(given.encode()).hexdigest()[:8]
    keep = NAME_BYTES - len(SUFFIX) - len(digest) - 1
    head = given.encode()[:keep].decode(errors="ignore")
    return f"{head}_{digest}{SUFFIX}"


def locate(dsn: str) -> DemoDatabase:
    """The demo database beside the database `dsn` names (which must exist: it says
    which server, and the name the demo's is derived from)."""
    with connect(dsn) as conn:
        row = conn.execute(SQL.sql("demo_current_database")).fetchone()
    assert row is not None
    given = str(row[0])
    name = demo_name(given)
    return DemoDatabase(given=given, name=name, dsn=with_database(dsn, name))


def ensure(dsn: str, demo: DemoDatabase) -> DemoDatabase:
    """The demo's database, created (connectable by its owner and superusers only) when
    missing; `created` says whether this call made it. `dsn` reaches the server."""
    with connect(dsn, autocommit=True) as conn:
        if conn.execute(SQL.sql("demo_database_exists"), [demo.name]).fetchone():
            return demo
        database = pgsql.Identifier(demo.name)
        try:
            conn.execute(pgsql.SQL(SQL.sql("demo_create_database")).format(database=database))
        except _RACES:  # another demo made it a moment ago
            return demo
        except psycopg.errors.InsufficientPrivilege as exc:
            raise PermissionDenied(
                f"the demo runs in a database of its own, {demo.name!r}, which this login "
                f"may not create ({exc.diag.message_primary}): run the demo as an "
                f"administrator, or have one run CREATE DATABASE {database.as_string(conn)} "
                "OWNER <this login>"
            ) from exc
        conn.execute(pgsql.SQL(SQL.sql("demo_private_database")).format(database=database))
    return DemoDatabase(given=demo.given, name=demo.name, dsn=demo.dsn, created=True)


@contextlib.contextmanager
def exclusive(dsn: str) -> Iterator[DemoDatabase]:
    """The demo database of `dsn`'s server (created when missing), with its run lock held
    for the block; `RefusedNow` (exit 75) when another demo holds it."""
    demo = ensure(dsn, locate(dsn))
    with connect(demo.dsn) as lock:
        _bootstrap(lock)
        lock.execute(SQL.sql("demo_lock_session"))
        lock.execute(SQL.sql("demo_lock_name"), [f"fleetq demo pid {os.getpid()}"])
        lock.commit()  # session settings: a rolled-back SET would be undone
        try:
            lock.execute(SQL.sql("demo_lock_nowait"))
        except psycopg.errors.LockNotAvailable:
            lock.rollback()
            holders = [str(h) for (h,) in lock.execute(SQL.sql("demo_lock_holders"))]
            raise RefusedNow(
                f"another fleetq demo is running in database {demo.name!r}"
                + (f" (held by {', '.join(holders)})" if holders else "")
                + "; wait for it to end, or stop it, then try again"
            ) from None
        try:
            yield demo
        finally:
            # given back now, not when the server notices the connection closed (a demo
            # started in that moment would find it held); a lost connection gave it back
            with contextlib.suppress(psycopg.Error):
                lock.rollback()
            lock.close()


def _bootstrap(conn: SyncConnection) -> None:
    """The lock's schema and table; two first runs racing on a CREATE: the loser's
    transaction rolled back, and it finds what the winner made."""
    lost: psycopg.Error | None = None
    for _ in range(_BOOTSTRAP_ATTEMPTS):
        try:
            conn.execute(SQL.sql("demo_lock_bootstrap"))
            conn.commit()
            return
        except _BOOTSTRAP_RACES as exc:
            conn.rollback()
            lost = exc
    raise MigrationError(f"could not create the demo's lock table: {lost}") from lost
