"""API tokens: a bearer token stands for a submitter, operator or reader identity, or for
one runner id (a runner that reaches the queue through `fleetq api`).

A token is made here, shown once (written to a file of mode 0600, or printed when asked)
and stored only as its SHA-256, so a copy of the database holds no usable token. The
HTTP API presents a request's token to the database (`fleetq.token`, transaction-local)
and the protocol's own checks decide what its holder may do: the same rules as a login
of that kind, in the same place.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel

from fleetq.core import queries
from fleetq.core.db import SyncConnection
from fleetq.core.errors import InvalidInput
from fleetq.core.roles import Kind, check_subject, write_private

PREFIX = "fq_"  # so a token is recognisable in a leak scanner or a log
KINDS = (Kind.SUBMITTER, Kind.OPERATOR, Kind.READER, Kind.RUNNER)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")


class Token(BaseModel):
    """A token as listed: never the token itself."""

    name: str
    kind: Kind
    subject: str
    created_at: datetime
    created_by: str | None = None


def digest(token: str) -> bytes:
    """What the database keeps and compares (`sha256(convert_to(token, 'UTF8'))`)."""
    return hashlib.sha256(token.encode()).digest()


def add(
    conn: SyncConnection, kind: Kind, subject: str, *, name: str, created_by: str | None
) -> tuple[Token, str]:
    """Make a token for `subject` acting as `kind`; return it with its secret, which is
    not kept anywhere else."""
    if kind not in KINDS:
        raise InvalidInput(
            f"a token acts as a submitter, an operator, a reader or a runner, not {kind}"
        )
    check_subject(kind, subject)
    if not _NAME.match(name):
        raise InvalidInput(f"{name!r} is not a token name (letters, digits, . _ @ -)")
    secret = PREFIX + secrets.token_urlsafe(32)
    row = conn.execute(
        queries.sql("tokens_add").encode(), [name, kind.value, subject, digest(secret), created_by]
    ).fetchone()
    if row is None:
        raise InvalidInput(f"a token named {name} exists already (fleetq tokens list)")
    return Token(
        name=name, kind=kind, subject=subject, created_at=row[0], created_by=created_by
    ), secret


def tokens(conn: SyncConnection) -> list[Token]:
    """Every token, by kind and name."""
    rows = conn.execute(queries.sql("tokens_list").encode()).fetchall()
    return [
        Token(name=r[0], kind=Kind(r[1]), subject=r[2], created_at=r[3], created_by=r[4])
        for r in rows
    ]


def revoke(conn: SyncConnection, name: str) -> bool:
    """Delete a token: the next request that presents it is refused. False if none."""
    return conn.execute(queries.sql("tokens_revoke").encode(), [name]).fetchone() is not None


def write_secret(path: Path, secret: str) -> None:
    """The token in a new file of mode 0600 (an existing file is never overwritten)."""
    write_private(path, secret + "\n", "a token file")
