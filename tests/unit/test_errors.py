"""Errors carry their default message and name the fix."""

from __future__ import annotations

from fleetq.core.errors import ConfigError, FleetqError, MigrationChecksumMismatch, SchemaOutOfDate


def test_docstring_is_the_default_message() -> None:
    assert str(ConfigError()) == "A fleet configuration file is invalid; nothing was changed."
    assert str(FleetqError("custom")) == "custom"


def test_schema_out_of_date_names_the_fix_both_ways() -> None:
    assert "run `fleetq migrate`" in str(SchemaOutOfDate(expected=2, found=1))
    assert "upgrade fleetq" in str(SchemaOutOfDate(expected=1, found=2))


def test_checksum_mismatch_is_forward_only_advice() -> None:
    err = MigrationChecksumMismatch(1, "0001_initial.sql", "a" * 64, "b" * 64)
    assert "0001_initial.sql was changed" in str(err)
    assert "new migration" in str(err)
