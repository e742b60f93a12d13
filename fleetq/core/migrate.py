"""Forward-only, checksummed schema migrations: bring a database to this code's schema,
and refuse to run on one it cannot use.

Why each rule (the files' names and markers: `migrationfiles`; the lock that makes one
run at a time: `migrationlock`):
- Each migration is applied in its own transaction, so a failing migration leaves the
  database at the last good version, never half-way.
- Each applied file's sha256 is recorded; a changed file is refused, because the schema
  it describes is no longer the schema the database has.
- Upgrades are expand first, contract later, so a fleet is upgraded node by node while
  older runners keep working. A numbered migration is *expand* (additive: new tables,
  nullable or defaulted columns, new functions, indexes; code one release
  older keeps working on it) unless its leading comment lines hold `-- fleetq: contract`
  (it drops or renames what older code uses, changes a signature or meaning older code
  calls, tightens a constraint older code may break).
- Processes that use the queue (runner, console, API, CLI) call `check_schema`: code that
  knows migrations 1..N runs on a database at M >= N when none of N+1..M is a contract
  migration, and refuses one behind (M < N: run `fleetq migrate`) or past a contract
  migration (named: upgrade this fleetq). Older code cannot read newer files, so the
  database records the kind of each migration it applied (`schema_migrations.contract`,
  migration 0023; false for every migration before it, all of them expand).
- `fleetq migrate` itself still refuses a database ahead of its code: only the newest
  fleetq migrates, since an older one would put its older protocol files back.
- The protocol's functions live apart, one file per concern (`migrations/protocol/`:
  claim, leases, cancel, fleet, ...), as `CREATE OR REPLACE` statements re-applied
  whenever a file's checksum changes (Flyway's repeatable migrations), after the numbered
  ones and all in one transaction: a function is read and changed in one place, and a
  change that fails leaves every function as it was. Tables change only in numbered
  migrations; a function is dropped or its signature changed in one too, with `DROP
  FUNCTION IF EXISTS` (a fresh database runs every numbered migration before any
  protocol file, so a function a protocol file made may not exist yet).
- The newest `fleetq migrate` re-applies the protocol files while older runners still
  call them, so a protocol change must be an expand change: it keeps every signature, and
  the meaning of every call, that older runners rely on (a new behaviour is a function
  of a new name; an added argument, defaulted or not, is a new overload beside the old
  one, and calls to the old one become ambiguous). Dropping a function or changing its
  signature or meaning is a contract change: it goes in a contract migration, in a
  release after the one whose code stopped calling the old form.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from enum import StrEnum
from pathlib import Path

import psycopg
from pydantic import BaseModel, ConfigDict

from fleetq.core.db import SyncConnection, connect, with_database, wrap_errors
from fleetq.core.driver import Driver
from fleetq.core.errors import MigrationChecksumMismatch, MigrationError, SchemaOutOfDate
from fleetq.core.migrationfiles import (
    PROTOCOL,
    Migration,
    ProtocolFile,
    discover,
    discover_protocol,
)
from fleetq.core.migrationlock import migration_lock, still_held
from fleetq.core.queries import sql


class MigrationState(StrEnum):
    """Where a migration stands in one database."""

    APPLIED = "applied"
    PENDING = "pending"
    CHANGED = "changed"  # applied, but the file differs now: refused until restored
    UNKNOWN = "unknown"  # applied by a newer fleetq: this code does not have the file


class MigrationStatus(BaseModel):
    """One row of `fleetq migrate --status`."""

    version: int
    name: str
    state: MigrationState
    applied_at: datetime | None = None
    contract: bool = False


class AppliedMigration(BaseModel):
    """One row of fleetq.schema_migrations: what a database says it has, including what
    code older than the database cannot read from files it lacks: whether a migration is
    a contract one."""

    model_config = ConfigDict(frozen=True)

    version: int
    name: str
    checksum: str
    applied_at: datetime
    contract: bool = False


def migrate(
    dsn: str,
    directory: Path | None = None,
    *,
    on_protocol: Callable[[str], None] | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> list[Migration]:
    """Apply every pending migration, then every changed protocol file (each named to
    `on_protocol`); return the migrations applied (empty when up to date). When another
    run holds the migration lock, `on_wait` hears whom this one waits for."""
    migrations = discover(directory)
    protocol = discover_protocol(directory)
    with connect(dsn, autocommit=True) as conn, migration_lock(conn, dsn, on_wait) as lock:
        applied = _applied(conn)
        _verify(migrations, applied)
        pending = [m for m in migrations if m.version not in applied]
        for migration in pending:
            still_held(lock)
            _apply(conn, migration)
        # the protocol after the migrations (a migration may drop a function whose
        # new signature a protocol file creates); ownership and grants after both
        still_held(lock)
        changed = _apply_protocol(conn, protocol)
        if pending and not changed:
            _secure(conn)
        for name in changed:
            if on_protocol is not None:
                on_protocol(name)
        return pending


def status(dsn: str, directory: Path | None = None) -> list[MigrationStatus]:
    """Every known and applied migration with its state, oldest first."""
    migrations = discover(directory)
    with connect(dsn, autocommit=True) as conn:
        applied = _applied(conn) if _has_table(conn) else {}
    rows: list[MigrationStatus] = []
    for m in migrations:
        record = applied.get(m.version)
        if record is None:
            rows.append(
                MigrationStatus(
                    version=m.version,
                    name=m.name,
                    state=MigrationState.PENDING,
                    contract=m.contract,
                )
            )
            continue
        state = MigrationState.APPLIED if record.checksum == m.checksum else MigrationState.CHANGED
        rows.append(_status_row(record, state))
    known = {m.version for m in migrations}
    rows += [
        _status_row(r, MigrationState.UNKNOWN) for r in applied.values() if r.version not in known
    ]
    return rows


def _status_row(record: AppliedMigration, state: MigrationState) -> MigrationStatus:
    return MigrationStatus(
        version=record.version,
        name=record.name,
        state=state,
        applied_at=record.applied_at,
        contract=record.contract,
    )


def check_schema(applied: Sequence[AppliedMigration], known: int) -> None:
    """Raise `SchemaOutOfDate` unless code that knows migrations 1..`known` may run on a
    database that has `applied`: all of its own, and past them only expand migrations.

    A database behind is refused (its code needs what is missing); one ahead through
    expand migrations is accepted, so an older runner that restarts during a rollout
    keeps working; one past a contract migration is refused, naming the first such
    migration, because something this code uses may be gone. Plain data, not a
    connection, so asyncpg and psycopg callers share it.
    """
    versions = {a.version for a in applied}
    found = max(versions, default=0)
    if found < known or len(versions) != found:  # behind, or a gap in the history
        raise SchemaOutOfDate(expected=known, found=found)
    newer = sorted((a for a in applied if a.version > known), key=lambda a: a.version)
    if contract := next((a for a in newer if a.contract), None):
        raise SchemaOutOfDate(expected=known, found=found, contract=contract.name)


def applied_sync(conn: SyncConnection) -> list[AppliedMigration]:
    """The applied migrations, read with psycopg (empty on a database never migrated)."""
    if not _has_table(conn):
        return []
    return list(_applied(conn).values())


def _has_table(conn: SyncConnection) -> bool:
    row = conn.execute(sql("migrate_has_table")).fetchone()
    return bool(row and row[0])


def _applied(conn: SyncConnection) -> dict[int, AppliedMigration]:
    cursor = conn.execute(sql("migrate_applied"))
    return {
        int(v): AppliedMigration(version=v, name=n, checksum=c, applied_at=a, contract=k)
        for v, n, c, a, k in cursor
    }


def _verify(migrations: list[Migration], applied: dict[int, AppliedMigration]) -> None:
    for m in migrations:
        record = applied.get(m.version)
        if record is not None and record.checksum != m.checksum:
            raise MigrationChecksumMismatch(m.version, m.name, record.checksum, m.checksum)
    newest_known = len(migrations)
    if applied and max(applied) > newest_known:
        raise SchemaOutOfDate(expected=newest_known, found=max(applied))


def _secure(conn: SyncConnection) -> None:
    """What a migration created belongs to whoever migrated, and a new function is
    PUBLIC's to execute: ownership and grants are asserted again, and the SELECT that
    `fleetq.secure()` grants on every table taken back from the lock's."""
    present = conn.execute(sql("migrate_has_secure")).fetchone()
    if present is not None and present[0]:
        with conn.transaction():
            conn.execute(sql("migrate_secure"))
            conn.execute(sql("migrate_lock_private"))


def _apply_protocol(conn: SyncConnection, files: list[ProtocolFile]) -> list[str]:
    """Re-apply the protocol files whose text changed, all in one transaction; return
    their names (empty when none changed)."""
    conn.execute(sql("migrate_protocol_bootstrap"))
    recorded = {str(n): str(c) for n, c in conn.execute(sql("migrate_protocol_applied"))}
    changed = [f for f in files if recorded.get(f.name) != f.checksum]
    if not changed:
        return []
    current = changed[0]
    try:
        with conn.transaction():
            for current in changed:
                conn.execute(current.path.read_bytes())
                conn.execute(sql("migrate_protocol_record"), [current.name, current.checksum])
            _secure(conn)
    except psycopg.Error as exc:
        raise MigrationError(
            f"{PROTOCOL}/{current.name} failed; no protocol file was applied: {exc}"
        ) from exc
    return [f"{PROTOCOL}/{f.name}" for f in changed]


def _apply(conn: SyncConnection, migration: Migration) -> None:
    try:
        with conn.transaction():
            conn.execute(migration.sql())
            conn.execute(
                sql("migrate_record"), [migration.version, migration.name, migration.checksum]
            )
            if migration.contract:  # what older code reads to know it must not start
                conn.execute(sql("migrate_record_contract"), [migration.version])
    except psycopg.Error as exc:
        raise MigrationError(f"{migration.name} failed and was rolled back: {exc}") from exc


def require_current(conn: SyncConnection, directory: Path | None = None) -> None:
    """Refuse to work on a database this code cannot run on (`check_schema`; the error
    names the fix). `directory` stands for another release's migrations (tests)."""
    check_schema(applied_sync(conn), len(discover(directory)))


async def require_current_async(driver: Driver, directory: Path | None = None) -> None:
    """`require_current` for the async drivers (runner, console, API, queue commands)."""
    known = len(discover(directory))
    rows = await driver.fetch(sql("migrate_has_table"))
    if not rows or not next(iter(rows[0].values())):
        check_schema([], known)
        return
    rows = await driver.fetch(sql("migrate_applied"))
    check_schema([AppliedMigration.model_validate(row) for row in rows], known)


@contextlib.contextmanager
def scratch_database(server_dsn: str, prefix: str, *, migrated: bool = True) -> Iterator[str]:
    """A new database on the server of `server_dsn`, migrated unless `migrated` is false
    (a benchmark's peer installs its own schema), dropped afterwards, for work that must
    not touch the fleet's own data (bench, screenshots)."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with wrap_errors(), psycopg.connect(server_dsn, autocommit=True, connect_timeout=10) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        dsn = with_database(server_dsn, name)
        if migrated:
            migrate(dsn)
        yield dsn
    finally:
        with wrap_errors(), psycopg.connect(server_dsn, autocommit=True, connect_timeout=10) as a:
            a.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
