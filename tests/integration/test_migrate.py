"""Migrations: ordered, once, under a lock, checksummed, refused when changed; and
which databases a release runs on (its own, and ahead of it through expand migrations
only), read the way its processes read them."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from fleetq.cli.main import main as fleetq
from fleetq.core import migrate
from fleetq.core.driver import open_driver
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
    (target / f"{len(migrate.discover(base)) + 1:04d}_{name}.sql").write_text(text)
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
    contract = re.escape(migrate.discover(after)[-1].name)
    with psycopg.connect(empty_dsn) as conn:
        for release in (None, following):  # this code; the next release, which added it
            with pytest.raises(SchemaOutOfDate, match=f"past {contract}, a contract migration"):
                migrate.require_current(conn, release)
        migrate.require_current(conn, after)  # the release that has it


def test_code_refuses_a_database_behind_it(empty_dsn: str, later: tuple[Path, Path]) -> None:
    migrate.migrate(empty_dsn)
    current = len(migrate.discover())
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
        contract = re.escape(migrate.discover(later[1])[-1].name)
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
        assert [int(v) for (v,) in rows] == [len(migrate.discover(later[1]))]
    kinds = [(r.state, r.contract) for r in migrate.status(empty_dsn)]  # as this code sees it
    unknown = MigrationState.UNKNOWN
    assert kinds[-3:] == [(MigrationState.APPLIED, False), (unknown, False), (unknown, True)]


def test_status_shows_which_migrations_are_contract_ones(
    empty_dsn: str, later: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    migrate.migrate(empty_dsn, later[1])
    assert fleetq(["--dsn", empty_dsn, "migrate", "--status"]) == 1  # two it does not know
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["version", "name", "kind"]
    assert [r.split()[2:4] for r in rows[-2:]] == [["expand", "unknown"], ["contract", "unknown"]]


async def test_a_database_from_before_the_contract_column_is_still_read(
    empty_dsn: str, migrations_copy: Path
) -> None:
    """The flag is read without naming its column: code that has the column's migration
    must still read a database without it, and say it is behind."""
    shipped = migrate.discover(migrations_copy)
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
