"""DSN handling shared by both drivers."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from fleetq.core.db import as_uri, writable


def test_key_value_dsns_become_uris_for_asyncpg() -> None:
    uri = "postgresql://u@h/db"
    assert as_uri(uri) == uri
    assert as_uri("host=/run/pg port=5433 user=ann dbname=fleet") == (
        "postgresql://ann@/fleet?host=/run/pg&port=5433"
    )
    assert as_uri("host=db.example password=p@ss user=ann dbname=q") == (
        "postgresql://ann:p%40ss@/q?host=db.example"
    )


def test_every_dsn_asks_for_a_server_that_takes_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a primary and its standbys listed, only `target_session_attrs=read-write`
    keeps libpq and asyncpg off a standby (tests/faults/test_failover.py)."""
    monkeypatch.delenv("PGTARGETSESSIONATTRS", raising=False)
    assert writable("postgresql://u@db1,db2/q") == (
        "postgresql://u@db1,db2/q?target_session_attrs=read-write"
    )
    assert writable("postgresql://u@/q?host=/a,/b&port=5432,5433") == (
        "postgresql://u@/q?host=/a,/b&port=5432,5433&target_session_attrs=read-write"
    )
    assert conninfo_to_dict(writable("host=db1,db2 dbname=q")) == {
        "host": "db1,db2",
        "dbname": "q",
        "target_session_attrs": "read-write",
    }
    # the DSN's own choice, or the environment's, stands
    assert writable("postgresql://u@h/q?target_session_attrs=any") == (
        "postgresql://u@h/q?target_session_attrs=any"
    )
    assert writable("host=h target_session_attrs=primary") == "host=h target_session_attrs=primary"
    monkeypatch.setenv("PGTARGETSESSIONATTRS", "any")
    assert writable("postgresql://u@h/q") == "postgresql://u@h/q"
