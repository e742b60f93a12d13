"""Database logins for the roles fleetq's migrations define (migration 0007).

Each login is a PostgreSQL role that can log in, a member of one fleetq group, and a row
in fleetq.logins that says what it acts as: a runner id, or the identity a submitter,
operator or reader acts under. Inside the protocol functions that row, found by
`session_user`, is the caller's identity; no parameter can name another.

Secrets: the password is made here, sent to the server only as a SCRAM verifier
(computed client-side, so a statement log never holds it), and written to a pgpass file
(mode 0600) that the printed DSN names with `passfile=`, never on a command line.
"""

from __future__ import annotations

import os
import re
import secrets
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from psycopg import sql
from pydantic import BaseModel

from fleetq.core import queries
from fleetq.core.db import SyncConnection, as_uri
from fleetq.core.errors import InvalidInput

# A runner id names a node and a runner on it, as fleetq-runner --node/--name make it.
_RUNNER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}/[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_IDENTITY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")
_LOGIN = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class Kind(StrEnum):
    """What a login is, and the group it joins."""

    RUNNER = "runner"
    SUBMITTER = "submitter"
    OPERATOR = "operator"
    READER = "reader"
    GATEWAY = "gateway"  # the HTTP API's login: acts only for an API token's holder

    @property
    def group(self) -> str:
        return f"fleetq_{self.value}"


# Per login, so a stuck client cannot hold the fleet up (role settings apply at login; a
# group's settings do not pass to its members). The runner's match its own defaults.
TIMEOUTS: dict[Kind, dict[str, str]] = {
    Kind.RUNNER: {
        "statement_timeout": "30s",
        "lock_timeout": "10s",
        "idle_in_transaction_session_timeout": "60s",
    },
    Kind.SUBMITTER: {
        "statement_timeout": "30s",
        "lock_timeout": "10s",
        "idle_in_transaction_session_timeout": "60s",
    },
    Kind.OPERATOR: {
        "statement_timeout": "60s",
        "lock_timeout": "10s",
        "idle_in_transaction_session_timeout": "60s",
    },
    Kind.READER: {"statement_timeout": "60s", "idle_in_transaction_session_timeout": "60s"},
    Kind.GATEWAY: {
        "statement_timeout": "30s",
        "lock_timeout": "10s",
        "idle_in_transaction_session_timeout": "60s",
    },
}


class Login(BaseModel):
    """One fleetq login."""

    role_name: str
    kind: Kind
    subject: str
    created_at: datetime | None = None


class Created(BaseModel):
    """A login just made: where its password is, and a DSN that uses that file."""

    login: Login
    password_file: Path
    dsn: str


def default_login(kind: Kind, subject: str) -> str:
    """`fleetq_runner_node_a_r` for runner `node-a/r`: lower case, [a-z0-9_], ≤ 63."""
    slug = re.sub(r"[^a-z0-9]+", "_", subject.lower()).strip("_")
    return f"fleetq_{kind.value}_{slug}"[:63]


def check_subject(kind: Kind, subject: str) -> None:
    """A runner login names a runner id (NODE/NAME); the others an identity."""
    if kind == Kind.RUNNER and not _RUNNER_ID.match(subject):
        raise InvalidInput(f"{subject!r} is not a runner id (NODE/NAME, as fleetq-runner uses)")
    if kind != Kind.RUNNER and not _IDENTITY.match(subject):
        raise InvalidInput(f"{subject!r} is not an identity (letters, digits, . _ @ -)")


def add(
    conn: SyncConnection,
    kind: Kind,
    subject: str,
    *,
    admin_dsn: str,
    password_file: Path,
    login: str | None = None,
) -> Created:
    """Create a login of `kind` acting as `subject`, with a fresh password written to
    `password_file` (refused if it exists). One transaction: all of it or nothing."""
    check_subject(kind, subject)
    name = login or default_login(kind, subject)
    if not _LOGIN.match(name):
        raise InvalidInput(f"{name!r}: a login is lower case letters, digits and _ (≤ 63)")
    if password_file.exists():
        raise InvalidInput(f"{password_file} exists: not overwriting a password file")
    password = secrets.token_urlsafe(24)
    verifier = conn.pgconn.encrypt_password(password.encode(), name.encode(), b"scram-sha-256")
    with conn.transaction():
        taken = conn.execute(queries.sql("roles_exists").encode(), [name]).fetchone()
        if taken is not None:
            raise InvalidInput(f"a role named {name} exists already (fleetq roles list)")
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}").format(
                sql.Identifier(name), sql.Literal(verifier.decode()), sql.Identifier(kind.group)
            )
        )
        # a database that keeps CONNECT from PUBLIC (the demo's, a hardened one) lets
        # its new login in: adding a login here is the grant
        conn.execute(
            sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                sql.Identifier(_database(conn)), sql.Identifier(name)
            )
        )
        for setting, value in TIMEOUTS[kind].items():
            conn.execute(
                sql.SQL("ALTER ROLE {} SET {} = {}").format(
                    sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)
                )
            )
        row = conn.execute(
            queries.sql("roles_add").encode(), [name, kind.value, subject]
        ).fetchone()
        assert row is not None
        _write_passfile(password_file, name, password)
    created = Login(role_name=name, kind=kind, subject=subject, created_at=row[0])
    return Created(
        login=created, password_file=password_file, dsn=dsn_for(admin_dsn, name, password_file)
    )


def remove(conn: SyncConnection, name: str) -> bool:
    """Drop a fleetq login (and its row); False when there was none."""
    with conn.transaction():
        row = conn.execute(queries.sql("roles_remove").encode(), [name]).fetchone()
        if row is None:
            return False
        if conn.execute(queries.sql("roles_exists").encode(), [name]).fetchone() is not None:
            conn.execute(
                sql.SQL("REVOKE CONNECT ON DATABASE {} FROM {}").format(
                    sql.Identifier(_database(conn)), sql.Identifier(name)
                )
            )
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
    return True


def _database(conn: SyncConnection) -> str:
    row = conn.execute(queries.sql("roles_database").encode()).fetchone()
    assert row is not None
    return str(row[0])


def logins(conn: SyncConnection) -> list[Login]:
    """Every fleetq login, by kind and name."""
    rows = conn.execute(queries.sql("roles_list").encode()).fetchall()
    return [Login(role_name=r[0], kind=Kind(r[1]), subject=r[2], created_at=r[3]) for r in rows]


def dsn_for(admin_dsn: str, login: str, password_file: Path) -> str:
    """The admin's DSN with this login as its user, no password, and `passfile=` naming
    the file that holds it (libpq and asyncpg both read it)."""
    parts = urlsplit(as_uri(admin_dsn))
    host = parts.hostname or ""
    netloc = f"{login}@{host}" + (f":{parts.port}" if parts.port else "")
    if ":" in host:
        netloc = f"{login}@[{host}]" + (f":{parts.port}" if parts.port else "")
    query = [
        (k, v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
        if k not in ("password", "passfile", "user")
    ]
    query.append(("passfile", str(password_file.resolve())))
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query, safe="/"), ""))


def _write_passfile(path: Path, login: str, password: str) -> None:
    """A pgpass line for this login on any host, port and database, mode 0600."""
    write_private(path, f"*:*:*:{_escape(login)}:{_escape(password)}\n", "a password file")


def write_private(path: Path, text: str, what: str) -> None:
    """A new file only its owner can read (mode 0600 from the start); an existing one is
    never overwritten."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise InvalidInput(f"{path} exists: not overwriting {what}") from None
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _escape(field: str) -> str:
    return field.replace("\\", "\\\\").replace(":", "\\:")
