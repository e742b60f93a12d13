"""Migrations: ordered, once, under a lock, checksummed, refused when changed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from fleetq.core import migrate
from fleetq.core.errors import MigrationChecksumMismatch, MigrationError, SchemaOutOfDate
from fleetq.core.migrate import MigrationState
from fleetq.core.resources import shipped_dir


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
    assert [m.version for m in applied] == list(range(1, len(migrate.discover()) + 1))
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
    count = len(migrate.discover(migrations_copy))
    bad = migrations_copy / f"{count + 1:04d}_broken.sql"
    bad.write_text("CREATE TABLE fleetq.half_done (id int);\nSELECT 1/0;\n")
    with pytest.raises(MigrationError, match=r"broken\.sql failed and was rolled back"):
        migrate.migrate(empty_dsn, migrations_copy)
    assert len(_recorded(empty_dsn)) == count
    with psycopg.connect(empty_dsn) as conn:
        row = conn.execute("SELECT to_regclass('fleetq.half_done')").fetchone()
        assert row == (None,)


def test_gap_in_numbering_is_an_error(migrations_copy: Path) -> None:
    ahead = len(migrate.discover(migrations_copy)) + 2  # one number skipped
    (migrations_copy / f"{ahead:04d}_far_ahead.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="numbering has a gap"):
        migrate.discover(migrations_copy)


def test_misnamed_file_is_an_error(migrations_copy: Path) -> None:
    (migrations_copy / "2_oops.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match=r"NNNN_description\.sql"):
        migrate.discover(migrations_copy)


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
    assert len(applied_lines) == len(migrate.discover())  # each applied by exactly one
    assert len(_recorded(empty_dsn)) == len(migrate.discover())


def test_check_schema_names_the_fix() -> None:
    current = len(migrate.discover())
    migrate.check_schema(list(range(1, current + 1)))
    with pytest.raises(SchemaOutOfDate, match="run `fleetq migrate`"):
        migrate.check_schema([])
    with pytest.raises(SchemaOutOfDate, match="upgrade fleetq"):
        migrate.check_schema(list(range(1, current + 2)))


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
    assert said == [f"protocol/{f.name}" for f in migrate.discover_protocol(migrations_copy)]
    assert "cancel.sql" in [f.name for f in migrate.discover_protocol(migrations_copy)]
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
