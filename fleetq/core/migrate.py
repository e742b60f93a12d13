"""Forward-only, checksummed schema migrations.

Why each rule:
- Files are `NNNN_description.sql`, applied in order, each in its own transaction, so a
  failing migration leaves the database at the last good version, never half-way.
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
- Each applied file's sha256 is recorded; a changed file is refused, because the schema
  it describes is no longer the schema the database has.
- Upgrades are expand first, contract later, so a fleet is upgraded node by node while
  older runners keep working. A numbered migration is *expand* (additive: new tables,
  nullable or defaulted columns, new functions, indexes; code one release
  older keeps working on it) unless its leading comment lines hold `-- fleetq: contract`
  (it drops or renames what older code uses, changes a signature or meaning older code
  calls, tightens a constraint older code may break). `-- fleetq: expand` may be written
  too; any other value, a second marker or one below the first statement is refused.
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
import hashlib
import os
import re
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
from fleetq.core.queries import sql
from fleetq.core.resources import shipped_dir

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
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_PROTOCOL_NAME = re.compile(r"^[a-z0-9_]+\.sql$")
# `-- fleetq: contract` (or `expand`), matched loosely so a misspelt one is refused, never
# read as no marker at all
_MARKER = re.compile(r"^--\s*fleetq\s*:(.*)$", re.IGNORECASE)
_KINDS = ("expand", "contract")
PROTOCOL = "protocol"  # the subdirectory of the migrations holding the protocol files


class Migration(BaseModel):
    """One migration file."""

    model_config = ConfigDict(frozen=True)

    version: int
    name: str
    path: Path
    checksum: str
    contract: bool = False  # `-- fleetq: contract` in its header

    def sql(self) -> bytes:
        """The file's bytes, exactly those that were checksummed."""
        return self.path.read_bytes()


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


def discover(directory: Path | None = None) -> list[Migration]:
    """The migration files in order; a misnamed file or a gap in numbering is an error,
    because it would silently reorder the schema's history."""
    directory = directory or shipped_dir("migrations")
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if match is None:
            raise MigrationError(f"{path.name}: migration files are named NNNN_description.sql")
        text = path.read_bytes()
        found.append(
            Migration(
                version=int(match[1]),
                name=path.name,
                path=path,
                checksum=hashlib.sha256(text).hexdigest(),
                contract=is_contract(path.name, text.decode("utf-8", errors="replace")),
            )
        )
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise MigrationError(
                f"{migration.name}: expected migration {expected:04d} here (numbering has a gap "
                "or a duplicate)"
            )
    return found


def is_contract(name: str, text: str) -> bool:
    """Whether a migration's leading comment lines hold `-- fleetq: contract`. A marker
    that is misspelt, repeated or below the first statement is an error, never a silent
    expand: a contract taken for an expand lets older code start on a schema it cannot
    use."""
    kinds: list[str] = []
    in_header = True
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        match = _MARKER.match(stripped)
        if match is None:
            in_header = in_header and (not stripped or stripped.startswith("--"))
            continue
        kind = match[1].strip().lower()
        where = f"{name} line {number}: `{stripped}`"
        if kind not in _KINDS:
            raise MigrationError(f"{where}: the kind is `expand` or `contract`")
        if not in_header:
            raise MigrationError(f"{where}: the marker belongs in the leading comment lines")
        if kinds:
            raise MigrationError(f"{where}: a migration has one marker at most")
        kinds.append(kind)
    return kinds == ["contract"]


class ProtocolFile(BaseModel):
    """One file of protocol functions, re-applied when its checksum changes."""

    model_config = ConfigDict(frozen=True)

    name: str
    path: Path
    checksum: str


def discover_protocol(directory: Path | None = None) -> list[ProtocolFile]:
    """The protocol files, in name order (the order they are applied in)."""
    base = (directory or shipped_dir("migrations")) / PROTOCOL
    found: list[ProtocolFile] = []
    for path in sorted(base.glob("*.sql")):
        if not _PROTOCOL_NAME.match(path.name):
            raise MigrationError(f"{PROTOCOL}/{path.name}: protocol files are named concern.sql")
        checksum = hashlib.sha256(path.read_bytes()).hexdigest()
        found.append(ProtocolFile(name=path.name, path=path, checksum=checksum))
    return found


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
    with connect(dsn, autocommit=True) as conn, _migration_lock(conn, dsn, on_wait) as lock:
        applied = _applied(conn)
        _verify(migrations, applied)
        pending = [m for m in migrations if m.version not in applied]
        for migration in pending:
            _still_held(lock)
            _apply(conn, migration)
        # the protocol after the migrations (a migration may drop a function whose
        # new signature a protocol file creates); ownership and grants after both
        _still_held(lock)
        changed = _apply_protocol(conn, protocol)
        if pending and not changed:
            _secure(conn)
        for name in changed:
            if on_protocol is not None:
                on_protocol(name)
        return pending


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
def _migration_lock(
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


def _still_held(lock: SyncConnection) -> None:
    """Before each step: the lock's session is alive and holds the lock, or the run stops
    with the database at the last migration it applied."""
    lost = "the migration lock's session ended; run `fleetq migrate` again"
    try:
        row = lock.execute(sql("migrate_lock_held")).fetchone()
    except psycopg.Error as exc:  # ended by the server (a timeout, an admin) or the network
        raise MigrationError(lost) from exc
    if not (row and row[0]):
        raise MigrationError(lost)


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
