"""The migration lock: one `fleetq migrate` or `fleetq demo --reset` at a time.

Why each rule:
- A run holds the migration lock, so two `fleetq migrate` started at once apply each
  migration exactly once: the second waits, then finds nothing pending. The lock is
  `LOCK TABLE fleetq.migration_lock IN EXCLUSIVE MODE` in a transaction of a second
  connection that lasts the whole run (the migrations commit one by one on the first),
  never an advisory key (issue 41): any login may take any advisory key, and keep a
  session's for as long as it stays connected, so one reader stalled every upgrade. The
  table belongs to fleetq_owner and no other role has any privilege on it (the SELECT
  `fleetq.secure()` grants on every table is taken back); a lock that conflicts with
  EXCLUSIVE needs a write privilege or ownership, so only administrators take it. It is
  fleetq_owner's from the start because `fleetq.secure()` hands tables to fleetq_owner
  with ALTER TABLE, which would wait for the run's own lock. The lock's session has no
  timeouts: it waits for another run, then sits idle in its transaction.
- The schema, the record table and the lock's table are made before the lock (there is
  nothing to lock yet): first runs racing there fail on a CREATE and run it again.
  `reset` locks and drops in one transaction; a run that waited on the dropped table
  starts over from that bootstrap. A run whose lock session ends stops before its next
  step (and the record's primary key refuses a migration applied twice regardless).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import psycopg

from fleetq.core.db import SyncConnection, connect
from fleetq.core.errors import MigrationError
from fleetq.core.queries import sql

# Attempts at the bootstrap (first runs racing on a CREATE) and at taking the lock (its
# table dropped by a `reset` while the run waited): each failure means another run got on.
_BOOTSTRAP_ATTEMPTS = 5
_LOCK_ATTEMPTS = 10
# The bootstrap lost a race: another run created the object first, or a reset dropped it.
_BOOTSTRAP_RACES = (
    psycopg.errors.UniqueViolation,
    psycopg.errors.DuplicateObject,
    psycopg.errors.DuplicateSchema,
    psycopg.errors.DuplicateTable,
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.UndefinedTable,
)
# The lock's table (or its schema) was dropped by a reset while this run waited on it.
_DROPPED = (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName)


def reset(dsn: str) -> None:
    """Drop the fleetq schema and everything in it, under the migration lock, so the next
    `migrate` starts from nothing. For starting a demo over (`fleetq demo --reset`); the
    rest of the database is left alone. The lock and the drop are one transaction: the
    lock's table goes with the schema, and a migrate waiting on it starts over."""
    for _ in range(_LOCK_ATTEMPTS):
        with connect(dsn, autocommit=True) as conn:
            try:
                with conn.transaction():
                    conn.execute(sql("migrate_reset"))
                return
            except _DROPPED:  # another reset dropped the lock's table while this waited
                continue
    raise MigrationError(f"the fleetq schema was dropped {_LOCK_ATTEMPTS} times meanwhile")


@contextlib.contextmanager
def migration_lock(
    conn: SyncConnection, dsn: str, on_wait: Callable[[str], None] | None
) -> Iterator[SyncConnection]:
    """Bootstrap on `conn`, then hold the migration lock on a connection of its own for
    the whole block; start over when a reset dropped the lock's table meanwhile."""
    for _ in range(_LOCK_ATTEMPTS):
        _bootstrap(conn)
        with connect(dsn) as lock:
            if not _take(lock, on_wait):
                continue
            try:
                # under the lock: GRANT and REVOKE lock nothing, and a REVOKE racing another
                # run's fleetq.secure() fails ("tuple concurrently updated")
                conn.execute(sql("migrate_lock_private"))
                yield lock
            finally:
                lock.close()  # ends its transaction, and with it the lock
            return
    raise MigrationError(f"the fleetq schema was dropped {_LOCK_ATTEMPTS} times meanwhile")


def _bootstrap(conn: SyncConnection) -> None:
    """The schema, the record table and the lock's table. Concurrent first runs race
    here; the loser's transaction rolled back, so it runs again and finds what the winner
    made. It runs beside another run's migrations, so it writes nothing that exists."""
    lost: psycopg.Error | None = None
    for _ in range(_BOOTSTRAP_ATTEMPTS):
        try:
            conn.execute(sql("migrate_bootstrap"))
            return
        except _BOOTSTRAP_RACES as exc:
            lost = exc
    raise MigrationError(f"could not create the fleetq schema: {lost}") from lost


def _take(lock: SyncConnection, on_wait: Callable[[str], None] | None) -> bool:
    """Take the migration lock in a transaction of `lock`, waiting as long as another run
    holds it (saying whom for); False when a reset dropped its table meanwhile."""
    lock.execute(sql("migrate_lock_session"))
    lock.commit()  # session settings: a rolled-back SET would be undone
    try:
        try:
            lock.execute(sql("migrate_lock_nowait"))
        except psycopg.errors.LockNotAvailable:
            lock.rollback()
            pids = [str(pid) for (pid,) in lock.execute(sql("migrate_lock_holders"))]
            if pids and on_wait is not None:
                on_wait(f"waiting for another fleetq migrate or reset (pid {', '.join(pids)})")
            lock.execute(sql("migrate_lock"))
    except _DROPPED:
        lock.rollback()
        return False
    return True


def still_held(lock: SyncConnection) -> None:
    """Before each step: the lock's session is alive and holds the lock, or the run stops
    with the database at the last migration it applied."""
    lost = "the migration lock's session ended; run `fleetq migrate` again"
    try:
        row = lock.execute(sql("migrate_lock_held")).fetchone()
    except psycopg.Error as exc:  # ended by the server (a timeout, an admin) or the network
        raise MigrationError(lost) from exc
    if not (row and row[0]):
        raise MigrationError(lost)
