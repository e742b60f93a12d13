"""DSN handling shared by both drivers."""

from __future__ import annotations

from fleetq.core.db import as_uri


def test_key_value_dsns_become_uris_for_asyncpg() -> None:
    uri = "postgresql://u@h/db"
    assert as_uri(uri) == uri
    assert as_uri("host=/run/pg port=5433 user=ann dbname=fleet") == (
        "postgresql://ann@/fleet?host=/run/pg&port=5433"
    )
    assert as_uri("host=db.example password=p@ss user=ann dbname=q") == (
        "postgresql://ann:p%40ss@/q?host=db.example"
    )
