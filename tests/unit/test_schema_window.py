"""Which databases a release may run on: its own migrations, and past them expand
migrations only (`check_schema`, on plain data); and how a file says it is a contract."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleetq.core import migrate, migrationfiles
from fleetq.core.errors import MigrationError, SchemaOutOfDate
from fleetq.core.migrate import AppliedMigration

_AT = datetime(2025, 1, 1, tzinfo=UTC)


def _db(count: int, *, contracts: tuple[int, ...] = ()) -> list[AppliedMigration]:
    """What a database at migration `count` records, `contracts` marked contract."""
    return [
        AppliedMigration(
            version=v,
            name=f"{v:04d}_{'contract' if v in contracts else 'expand'}_{v}.sql",
            checksum="0" * 64,
            applied_at=_AT,
            contract=v in contracts,
        )
        for v in range(1, count + 1)
    ]


def test_a_database_at_this_codes_migrations_is_accepted() -> None:
    migrate.check_schema(_db(22), 22)
    migrate.check_schema(_db(22, contracts=(20, 22)), 22)  # contracts this code has


def test_a_database_ahead_through_expand_migrations_is_accepted() -> None:
    migrate.check_schema(_db(23), 22)
    migrate.check_schema(_db(25, contracts=(3, 22)), 22)


def test_a_database_past_a_contract_migration_is_refused_naming_it() -> None:
    with pytest.raises(SchemaOutOfDate, match=r"past 0024_contract_24\.sql") as refused:
        migrate.check_schema(_db(25, contracts=(24, 25)), 22)  # the first one is named
    assert "upgrade fleetq on this machine" in str(refused.value)
    assert "knows up to 0022" in str(refused.value)
    assert (refused.value.expected, refused.value.found) == (22, 25)
    assert refused.value.contract == "0024_contract_24.sql"


def test_one_contract_migration_ahead_is_enough_to_refuse() -> None:
    with pytest.raises(SchemaOutOfDate, match=r"0023_contract_23\.sql"):
        migrate.check_schema(_db(23, contracts=(23,)), 22)


def test_a_database_behind_is_refused_with_the_fix() -> None:
    with pytest.raises(SchemaOutOfDate, match=r"at migration 0021, this fleetq needs 0022: run"):
        migrate.check_schema(_db(21), 22)
    with pytest.raises(SchemaOutOfDate, match="0000"):
        migrate.check_schema([], 22)


def test_a_gap_in_the_history_is_refused() -> None:
    holed = [a for a in _db(24) if a.version != 23]
    with pytest.raises(SchemaOutOfDate):
        migrate.check_schema(holed, 22)


def test_the_contract_marker_is_read_from_the_leading_comments() -> None:
    assert migrationfiles.is_contract("x.sql", "-- why\n-- fleetq: contract\n\nDROP TABLE t;\n")
    assert migrationfiles.is_contract("x.sql", "--fleetq:contract\nDROP TABLE t;\n")
    assert migrationfiles.is_contract("x.sql", "-- FleetQ: Contract\nDROP TABLE t;\n")
    assert not migrationfiles.is_contract("x.sql", "-- fleetq: expand\nCREATE TABLE t ();\n")
    assert not migrationfiles.is_contract("x.sql", "-- no marker: expand\nCREATE TABLE t ();\n")
    assert not migrationfiles.is_contract("x.sql", "-- see fleetq/core/migrate.py\nSELECT 1;\n")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("-- fleetq: contracts\nDROP TABLE t;\n", "the kind is `expand` or `contract`"),
        ("-- fleetq:\nDROP TABLE t;\n", "the kind is `expand` or `contract`"),
        ("DROP TABLE t;\n-- fleetq: contract\n", "belongs in the leading comment lines"),
        ("-- fleetq: expand\n-- fleetq: contract\nSELECT 1;\n", "one marker at most"),
    ],
)
def test_a_doubtful_marker_is_an_error_not_an_expand(text: str, says: str) -> None:
    with pytest.raises(MigrationError, match=says):
        migrationfiles.is_contract("0042_x.sql", text)


def test_discover_reads_each_files_kind(tmp_path: Path) -> None:
    (tmp_path / "0001_tables.sql").write_text("-- fleetq: expand\nCREATE TABLE t (a int);\n")
    (tmp_path / "0002_drop.sql").write_text("-- fleetq: contract\nALTER TABLE t DROP a;\n")
    (tmp_path / "0003_index.sql").write_text("CREATE INDEX ON t (a);\n")
    assert [m.contract for m in migrationfiles.discover(tmp_path)] == [False, True, False]
    (tmp_path / "0004_typo.sql").write_text("-- fleetq: contrat\nSELECT 1;\n")
    with pytest.raises(MigrationError, match=r"0004_typo\.sql line 1"):
        migrationfiles.discover(tmp_path)


def test_every_shipped_migration_before_the_contract_column_is_expand() -> None:
    """The column that records the kind defaults to false for them: honest only while
    none of their files says contract (their text can no longer change)."""
    shipped = migrationfiles.discover()
    column = next(m.version for m in shipped if m.name.endswith("_contract_migrations.sql"))
    assert not any(m.contract for m in shipped if m.version <= column)
