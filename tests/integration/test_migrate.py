"""Migrations: ordered, once, under a lock only administrators can take, checksummed,
refused when changed; and which databases a release runs on (its own, and ahead of it
through expand migrations only), read the way its processes read them."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Generic, TypeVar

import psycopg
import pytest

from fleetq.cli.main import main as fleetq
from fleetq.core import migrate, migrationfiles, migrationlock, roles
from fleetq.core.driver import open_driver
from fleetq.core.errors import MigrationChecksumMismatch, MigrationError, SchemaOutOfDate
from fleetq.core.migrate import MigrationState
from fleetq.core.resources import shipped_dir
from tests.integration.conftest import Login, login_dsn
from tests.locks import wait_for

T = TypeVar("T")


def _recorded(dsn: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT version, name FROM fleetq.schema_migrations ORDER BY 1")
        return [(int(v), str(n)) for v, n in rows]


@pytest.fixture
def migrations_copy(tmp_path: Path) -> Path:
    """The shipped migrations, copied so a test may add or edit files."""
    target = tmp_path / "migrations"
    shutil.copytree(shipped_dir("migrations"), target)
    return target


def test_first_run_applies_all_and_second_is_a_no_op(empty_dsn: str) -> None:
    applied = migrate.migrate(empty_dsn)
    assert [m.version for m in applied] == list(range(1, len(migrationfiles.discover()) + 1))
    assert migrate.migrate(empty_dsn) == []
    assert _recorded(empty_dsn) == [(m.version, m.name) for m in applied]


def test_status_lists_pending_then_applied(empty_dsn: str) -> None:
    assert {r.state for r in migrate.status(empty_dsn)} == {MigrationState.PENDING}
    migrate.migrate(empty_dsn)
    rows = migrate.status(empty_dsn)
    assert {r.state for r in rows} == {MigrationState.APPLIED}
    assert all(r.applied_at is not None for r in rows)


def test_changed_file_is_refused_and_shown(empty_dsn: str, migrations_copy: Path) -> None:
    migrate.migrate(empty_dsn, migrations_copy)
    first = migrations_copy / "0001_initial.sql"
    first.write_text(first.read_text() + "\n-- an innocent-looking edit\n")
    with pytest.raises(MigrationChecksumMismatch, match=r"0001_initial\.sql was changed"):
        migrate.migrate(empty_dsn, migrations_copy)
    assert migrate.status(empty_dsn, migrations_copy)[0].state == MigrationState.CHANGED


def test_failing_migration_rolls_back_alone(empty_dsn: str, migrations_copy: Path) -> None:
    count = len(migrationfiles.discover(migrations_copy))
    bad = migrations_copy / f"{count + 1:04d}_broken.sql"
    bad.write_text("CREATE TABLE fleetq.half_done (id int);\nSELECT 1/0;\n")
    with pytest.raises(MigrationError, match=r"broken\.sql failed and was rolled back"):
        migrate.migrate(empty_dsn, migrations_copy)
    assert len(_recorded(empty_dsn)) == count
    with psycopg.connect(empty_dsn) as conn:
        row = conn.execute("SELECT to_regclass('fleetq.half_done')").fetchone()
        assert row == (None,)


def test_gap_in_numbering_is_an_error(migrations_copy: Path) -> None:
    ahead = len(migrationfiles.discover(migrations_copy)) + 2  # one number skipped
    (migrations_copy / f"{ahead:04d}_far_ahead.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="numbering has a gap"):
        migrationfiles.discover(migrations_copy)


def test_misnamed_file_is_an_error(migrations_copy: Path) -> None:
    (migrations_copy / "2_oops.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match=r"NNNN_description\.sql"):
        migrationfiles.discover(migrations_copy)


def test_concurrent_migrate_from_two_processes_applies_each_once(empty_dsn: str) -> None:
    argv = [sys.executable, "-m", "fleetq", "--dsn", empty_dsn, "migrate"]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    applied_lines = [
        line for out, _ in outputs for line in out.splitlines() if line.startswith("applied ")
    ]
    assert len(applied_lines) == len(migrationfiles.discover())  # each applied by exactly one
    assert len(_recorded(empty_dsn)) == len(migrationfiles.discover())


def test_database_newer_than_code_is_refused(empty_dsn: str, migrations_copy: Path) -> None:
    migrate.migrate(empty_dsn)
    newest = max(migrations_copy.glob("*.sql"))
    newest.unlink()
    with pytest.raises(SchemaOutOfDate, match="upgrade fleetq"):
        migrate.migrate(empty_dsn, migrations_copy)
    assert migrate.status(empty_dsn, migrations_copy)[-1].state == MigrationState.UNKNOWN


def test_require_current_on_unmigrated_database(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn) as conn, pytest.raises(SchemaOutOfDate, match="0000"):
        migrate.require_current(conn)


def test_a_scratch_database_is_migrated_and_dropped(server_dsn: str) -> None:
    with migrate.scratch_database(server_dsn, "fleetq_scratch") as dsn:
        assert {r.state for r in migrate.status(dsn)} == {MigrationState.APPLIED}
        name = dsn.rsplit("/", 1)[-1].split("?")[0]
    with psycopg.connect(server_dsn) as conn:
        gone = conn.execute(b"SELECT count(*) FROM pg_database WHERE datname = %s", [name])
        assert gone.fetchone() == (0,)


def _function_source(dsn: str, name: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT prosrc FROM pg_proc WHERE oid = to_regproc(%s)", [f"fleetq.{name}"]
        ).fetchone()
    assert row is not None
    return str(row[0])


def test_protocol_files_are_applied_once_then_again_only_when_changed(
    empty_dsn: str, migrations_copy: Path
) -> None:
    said: list[str] = []
    migrate.migrate(empty_dsn, migrations_copy, on_protocol=said.append)
    assert said == [f"protocol/{f.name}" for f in migrationfiles.discover_protocol(migrations_copy)]
    assert "cancel.sql" in [f.name for f in migrationfiles.discover_protocol(migrations_copy)]
    said.clear()
    assert migrate.migrate(empty_dsn, migrations_copy, on_protocol=said.append) == []
    assert said == []

    cancel = migrations_copy / "protocol" / "cancel.sql"
    cancel.write_text(cancel.read_text().replace("BEGIN", "BEGIN\n    -- edited", 1))
    migrate.migrate(empty_dsn, migrations_copy, on_protocol=said.append)
    assert said == ["protocol/cancel.sql"]
    assert "-- edited" in _function_source(empty_dsn, "cancel_unchecked")


def test_a_failing_protocol_file_leaves_every_function_as_it_was(
    empty_dsn: str, migrations_copy: Path
) -> None:
    migrate.migrate(empty_dsn, migrations_copy)
    before = _function_source(empty_dsn, "cancel_unchecked")
    cancel = migrations_copy / "protocol" / "cancel.sql"
    cancel.write_text(cancel.read_text().replace("BEGIN", "BEGIN\n    -- edited", 1))
    (migrations_copy / "protocol" / "zz_broken.sql").write_text("SELECT 1/0;\n")
    with pytest.raises(MigrationError, match=r"protocol/zz_broken\.sql failed; no protocol"):
        migrate.migrate(empty_dsn, migrations_copy)
    assert _function_source(empty_dsn, "cancel_unchecked") == before
    (migrations_copy / "protocol" / "zz_broken.sql").unlink()
    said: list[str] = []
    migrate.migrate(empty_dsn, migrations_copy, on_protocol=said.append)
    assert said == ["protocol/cancel.sql"]  # its change was not recorded as applied


# Two later releases, as a rollout sees them: the next one adds a column that no older
# code names (expand), the one after drops it (contract: code that knew it may use it).
_ADD_NOTE = """-- a later release's column: older code never names it

ALTER TABLE fleetq.lanes ADD COLUMN note text;
"""
_DROP_NOTE = """-- the release after drops it: code that knew the column may use it
-- fleetq: contract

ALTER TABLE fleetq.lanes DROP COLUMN note;
"""


def _release(base: Path, target: Path, name: str, text: str) -> Path:
    """A later release's migrations: those of `base` and one more, numbered on."""
    shutil.copytree(base, target)
    (target / f"{len(migrationfiles.discover(base)) + 1:04d}_{name}.sql").write_text(text)
    return target


@pytest.fixture
def later(tmp_path: Path) -> tuple[Path, Path]:
    """The migrations of the next release (one expand ahead of this code) and of the one
    after it (then a contract)."""
    following = _release(shipped_dir("migrations"), tmp_path / "next", "add_lane_note", _ADD_NOTE)
    return following, _release(following, tmp_path / "after", "drop_lane_note", _DROP_NOTE)


def test_old_code_runs_on_a_database_an_expand_migration_ahead(
    empty_dsn: str, later: tuple[Path, Path]
) -> None:
    migrate.migrate(empty_dsn, later[0])
    with psycopg.connect(empty_dsn) as conn:
        migrate.require_current(conn)  # this code: the database is one migration ahead
    # but only the newest fleetq migrates: an older one would put back its protocol files
    with pytest.raises(SchemaOutOfDate, match="upgrade fleetq"):
        migrate.migrate(empty_dsn)


def test_old_code_refuses_a_database_past_a_contract_migration_naming_it(
    empty_dsn: str, later: tuple[Path, Path]
) -> None:
    following, after = later
    migrate.migrate(empty_dsn, after)
    contract = re.escape(migrationfiles.discover(after)[-1].name)
    with psycopg.connect(empty_dsn) as conn:
        for release in (None, following):  # this code; the next release, which added it
            with pytest.raises(SchemaOutOfDate, match=f"past {contract}, a contract migration"):
                migrate.require_current(conn, release)
        migrate.require_current(conn, after)  # the release that has it


def test_code_refuses_a_database_behind_it(empty_dsn: str, later: tuple[Path, Path]) -> None:
    migrate.migrate(empty_dsn)
    current = len(migrationfiles.discover())
    behind = f"at migration {current:04d}, this fleetq needs {current + 1:04d}: run `fleetq"
    with psycopg.connect(empty_dsn) as conn, pytest.raises(SchemaOutOfDate, match=behind):
        migrate.require_current(conn, later[0])


async def test_the_async_start_up_check_runs_on_an_expand_migration_ahead(
    empty_dsn: str, later: tuple[Path, Path]
) -> None:
    """What runners, the console and the API call before anything else, on asyncpg."""
    migrate.migrate(empty_dsn, later[0])
    async with open_driver(empty_dsn, kind="asyncpg") as driver:
        await migrate.require_current_async(driver)
        migrate.migrate(empty_dsn, later[1])
        contract = re.escape(migrationfiles.discover(later[1])[-1].name)
        with pytest.raises(SchemaOutOfDate, match=f"past {contract}"):
            await migrate.require_current_async(driver)
        newer = _release(later[1], later[1].parent / "newer", "more", "SELECT 1;")
        with pytest.raises(SchemaOutOfDate, match="run `fleetq migrate`"):
            await migrate.require_current_async(driver, newer)  # a database behind


def test_migrate_records_which_migrations_are_contract_ones(
    empty_dsn: str, later: tuple[Path, Path]
) -> None:
    migrate.migrate(empty_dsn, later[1])
    with psycopg.connect(empty_dsn) as conn:
        rows = conn.execute("SELECT version FROM fleetq.schema_migrations WHERE contract")
        assert [int(v) for (v,) in rows] == [len(migrationfiles.discover(later[1]))]
    kinds = [(r.state, r.contract) for r in migrate.status(empty_dsn)]  # as this code sees it
    unknown = MigrationState.UNKNOWN
    assert kinds[-3:] == [(MigrationState.APPLIED, False), (unknown, False), (unknown, True)]


def test_status_shows_which_migrations_are_contract_ones(
    empty_dsn: str, later: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    migrate.migrate(empty_dsn, later[1])
    assert fleetq(["--dsn", empty_dsn, "migrate", "--status"]) == 78  # a contract it does not know
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["version", "name", "kind"]
    assert [r.split()[2:4] for r in rows[-2:]] == [["expand", "unknown"], ["contract", "unknown"]]


async def test_a_database_from_before_the_contract_column_is_still_read(
    empty_dsn: str, migrations_copy: Path
) -> None:
    """The flag is read without naming its column: code that has the column's migration
    must still read a database without it, and say it is behind."""
    shipped = migrationfiles.discover(migrations_copy)
    column = next(m for m in shipped if m.name.endswith("_contract_migrations.sql"))
    for m in shipped[column.version - 1 :]:
        m.path.unlink()
    migrate.migrate(empty_dsn, migrations_copy)
    with psycopg.connect(empty_dsn) as conn:
        migrate.require_current(conn, migrations_copy)
        with pytest.raises(SchemaOutOfDate, match="run `fleetq migrate`"):
            migrate.require_current(conn)
    async with open_driver(empty_dsn, kind="asyncpg") as driver:
        await migrate.require_current_async(driver, migrations_copy)
        with pytest.raises(SchemaOutOfDate, match="run `fleetq migrate`"):
            await migrate.require_current_async(driver)
    assert migrate.status(empty_dsn)[column.version - 1].state == MigrationState.PENDING
    migrate.migrate(empty_dsn)
    with psycopg.connect(empty_dsn) as conn:
        migrate.require_current(conn)


# The migration lock (issue 41): a table lock no fleetq login can take, never an
# advisory key, which any login takes (and one taken for the session holds until the
# session ends).
OLD_ADVISORY_KEY = 0x666C_6565_7471  # what `fleetq migrate` locked before issue 41
DEADLINE_S = 20.0  # a one-migration run takes well under a second


class _InThread(Generic[T]):
    """A call run in a daemon thread, so a test can wait for it with a deadline and still
    end (a call stuck on a lock dies with the test's database)."""

    def __init__(self, call: Callable[[], T]) -> None:
        self._result: list[T] = []
        self._error: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], T]) -> None:
        try:
            self._result.append(call())
        except BaseException as exc:  # handed to the test by outcome()
            self._error.append(exc)

    def outcome(self, deadline_s: float = DEADLINE_S) -> T:
        """What the call returned (or raise what it raised), failing past the deadline."""
        self.thread.join(deadline_s)
        assert not self.thread.is_alive(), f"still running after {deadline_s}s"
        if self._error:
            raise self._error[0]
        return self._result[0]


def _waiting_on_the_lock(dsn: str, relation: int) -> int:
    """How many sessions wait to lock the migration lock's table (by oid: it may be gone)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'relation' AND relation = %s"
            " AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [relation],
        ).fetchone()
    return int(row[0]) if row else 0


def _lock_oid(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT 'fleetq.migration_lock'::regclass::oid").fetchone()
    assert row is not None
    return int(row[0])


def _privileges(dsn: str) -> tuple[str, list[str]] | None:
    """The lock's table's owner, and every other role with a privilege on it."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT c.relowner::regrole::text, coalesce(array_agg(a.grantee::regrole::text)"
            "  FILTER (WHERE a.grantee <> c.relowner), '{}')"
            " FROM pg_class c LEFT JOIN LATERAL aclexplode(c.relacl) a ON true"
            " WHERE c.oid = 'fleetq.migration_lock'::regclass GROUP BY c.relowner"
        ).fetchone()


def _migrates_waiting(dsn: str) -> int:
    """How many of fleetq's own sessions (migrate's) wait on a lock of any kind."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'fleetq' AND wait_event_type = 'Lock'"
        ).fetchone()
    return int(row[0]) if row else 0


def test_only_the_owner_has_any_privilege_on_the_migration_lock(db_dsn: str) -> None:
    """fleetq.secure() grants SELECT on every table to readers and operators; migrate
    takes it back from the lock's table, and PUBLIC never had any."""
    assert _privileges(db_dsn) == ("fleetq_owner", [])


def test_a_migrate_beside_a_running_one_waits_on_the_lock_alone(
    db_dsn: str, later: tuple[Path, Path]
) -> None:
    """A run's bootstrap goes on beside another run's migrations, which grant on every
    table (fleetq.secure()) without taking a lock: it must write nothing they write (two
    grants on one table at once fail), only wait for the lock, then take the grant back."""
    grant = b"GRANT SELECT ON ALL TABLES IN SCHEMA fleetq TO fleetq_reader"
    # a run: its lock's session, and its main one, which applied a migration that granted
    # and is half-way through the next, which grants again
    with psycopg.connect(db_dsn) as lock, psycopg.connect(db_dsn) as main:
        lock.execute("LOCK TABLE fleetq.migration_lock IN EXCLUSIVE MODE")
        main.execute(grant)
        main.commit()
        main.execute(grant)
        run = _InThread(lambda: migrate.migrate(db_dsn, later[0]))
        wait_for(lambda: _migrates_waiting(db_dsn) == 1, "the second run waiting")
        main.commit()
        lock.rollback()
    assert [m.name for m in run.outcome()] == [migrationfiles.discover(later[0])[-1].name]
    assert _privileges(db_dsn) == ("fleetq_owner", [])


@pytest.mark.parametrize("kind", list(roles.Kind))
def test_no_fleetq_login_can_hold_up_a_migration(
    db_dsn: str, login: Login, later: tuple[Path, Path], kind: roles.Kind
) -> None:
    """A login made by `fleetq roles` takes what it can of every lock a migration ever
    used, and keeps it in an open transaction; a migration still runs to its end."""
    subject = "node-x/holder" if kind == roles.Kind.RUNNER else "holder"
    with psycopg.connect(login(kind, subject)) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [OLD_ADVISORY_KEY])  # the session's
        holder.execute("SELECT pg_advisory_xact_lock(%s)", [OLD_ADVISORY_KEY])
        holder.execute("SELECT max(version) FROM fleetq.schema_migrations")  # as clients do
        for attempt in (
            "LOCK TABLE fleetq.migration_lock IN EXCLUSIVE MODE",
            "LOCK TABLE fleetq.migration_lock IN ROW SHARE MODE",
            "LOCK TABLE fleetq.migration_lock IN ACCESS SHARE MODE",
            "SELECT FROM fleetq.migration_lock FOR UPDATE",
            "SELECT FROM fleetq.migration_lock FOR KEY SHARE",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege), holder.transaction():
                holder.execute(attempt.encode())
        assert holder.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        pid = holder.info.backend_pid
        with psycopg.connect(db_dsn) as admin:
            held = admin.execute(
                "SELECT count(*) FROM pg_locks WHERE pid = %s AND locktype = 'advisory'"
                " AND granted",
                [pid],
            ).fetchone()
        assert held == (1,)  # the old key, held twice (session and transaction)

        run = _InThread(lambda: migrate.migrate(db_dsn, later[0]))
        assert [m.name for m in run.outcome()] == [migrationfiles.discover(later[0])[-1].name]
        holder.rollback()


def test_concurrent_first_runs_apply_each_migration_once(empty_dsn: str) -> None:
    """First runs race on creating the schema and the lock's table (no lock exists yet),
    then take turns under the lock: every migration is applied by exactly one of them."""
    runs = [_InThread(lambda: migrate.migrate(empty_dsn)) for _ in range(4)]
    applied = [m.version for run in runs for m in run.outcome(120.0)]
    everything = [m.version for m in migrationfiles.discover()]
    assert sorted(applied) == everything
    assert [v for v, _ in _recorded(empty_dsn)] == everything


def test_reset_drops_the_lock_a_migrate_waits_on_and_the_migrate_starts_over(
    db_dsn: str, later: tuple[Path, Path]
) -> None:
    """A reset takes the lock and drops the schema in one transaction; a migrate waiting
    on the dropped table bootstraps again and migrates from nothing."""
    relation = _lock_oid(db_dsn)
    said: list[str] = []
    with psycopg.connect(db_dsn) as stand_in:  # a migrate, running
        stand_in.execute("LOCK TABLE fleetq.migration_lock IN EXCLUSIVE MODE")
        reset = _InThread(lambda: migrationlock.reset(db_dsn))
        wait_for(lambda: _waiting_on_the_lock(db_dsn, relation) == 1, "the reset waiting")
        run = _InThread(lambda: migrate.migrate(db_dsn, later[0], on_wait=said.append))
        wait_for(lambda: _waiting_on_the_lock(db_dsn, relation) == 2, "the migrate waiting")
        pid = stand_in.info.backend_pid
        stand_in.rollback()
    reset.outcome()  # first in line: it dropped the table the migrate waited on
    everything = migrationfiles.discover(later[0])
    assert run.outcome() == everything
    assert _recorded(db_dsn) == [(m.version, m.name) for m in everything]
    assert said == [f"waiting for another fleetq migrate or reset (pid {pid})"]


def test_a_reset_waits_for_a_running_migrate(db_dsn: str) -> None:
    """A reset never drops a schema a migrate is half-way through."""
    relation = _lock_oid(db_dsn)
    with psycopg.connect(db_dsn) as stand_in:
        stand_in.execute("LOCK TABLE fleetq.migration_lock IN EXCLUSIVE MODE")
        reset = _InThread(lambda: migrationlock.reset(db_dsn))
        wait_for(lambda: _waiting_on_the_lock(db_dsn, relation) == 1, "the reset waiting")
        assert _recorded(db_dsn)  # still all there
        stand_in.rollback()
    reset.outcome()
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT to_regnamespace('fleetq')").fetchone() == (None,)


def test_the_lock_outlasts_the_servers_idle_in_transaction_timeout(
    db_dsn: str, later: tuple[Path, Path]
) -> None:
    """The lock's session sits idle in its transaction while migrations run on the other
    connection; a server that ends idle transactions must not end it half-way."""
    slow = _release(later[0], later[0].parent / "slow", "slow", "SELECT pg_sleep(1);\n")
    with psycopg.connect(db_dsn, autocommit=True) as admin:
        name = admin.info.dbname
        admin.execute(
            f'ALTER DATABASE "{name}" SET idle_in_transaction_session_timeout = 300'.encode()
        )
    applied = migrate.migrate(db_dsn, slow)
    assert [m.name for m in applied] == [m.name for m in migrationfiles.discover(slow)[-2:]]


@contextlib.contextmanager
def _administrator(db_dsn: str) -> Iterator[str]:
    """The DSN of an administrator made by hand: a member of fleetq_owner, no superuser,
    without CREATE on the database; dropped afterwards."""
    name = f"fq_admin_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{name}" LOGIN NOSUPERUSER IN ROLE fleetq_owner'.encode())
        try:
            yield login_dsn(db_dsn, name)
        finally:
            conn.execute(f'DROP ROLE "{name}"'.encode())


def test_an_administrator_who_is_no_superuser_migrates(
    db_dsn: str, later: tuple[Path, Path]
) -> None:
    """Administrators need not be superusers (docs/security.md): a member of fleetq_owner
    takes the lock as its owner, and the bootstrap asks for no CREATE on the database."""
    with _administrator(db_dsn) as dsn:
        assert [m.name for m in migrate.migrate(dsn, later[0])] == [
            migrationfiles.discover(later[0])[-1].name
        ]
        assert migrate.migrate(dsn, later[0]) == []
