"""Fixtures shared by the integration tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from fleetq.cli.main import main as fleetq
from fleetq.core import roles
from fleetq.core.db import SyncConnection, as_uri, connect
from tests import fleet
from tests.locks import wait_for

Run = tuple[int, str, str]
Cli = Callable[..., Run]  # fleetq ARGS... -> (exit status, stdout, stderr)


@pytest.fixture
def cli(db_dsn: str, sync_conn: SyncConnection, capsys: pytest.CaptureFixture[str]) -> Cli:
    fleet.operations(sync_conn)

    def command(argv: list[str]) -> int:
        try:
            return fleetq(["--dsn", db_dsn, *argv])
        except SystemExit as exc:  # argparse's usage errors
            return int(exc.code or 0)

    def run(*argv: str) -> Run:
        # a thread of its own: the CLI runs its own event loop, and async tests have one
        with ThreadPoolExecutor(1) as pool:
            code = pool.submit(command, list(argv)).result()
        out, err = capsys.readouterr()
        return code, out, err

    return run


Login = Callable[[roles.Kind, str], str]  # (kind, subject) -> a DSN logged in as it


def login_dsn(dsn: str, login: str) -> str:
    parts = urlsplit(as_uri(dsn))
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{login}@{host}"))


@pytest.fixture
def login(db_dsn: str, sync_conn: SyncConnection, tmp_path: Path) -> Iterator[Login]:
    """Make logins (unique names: roles are the whole cluster's) and drop them after."""
    fleet.operations(sync_conn)
    made: list[str] = []

    def make(kind: roles.Kind, subject: str) -> str:
        name = f"fq_{kind.value}_{uuid.uuid4().hex[:10]}"
        with connect(db_dsn) as conn:
            roles.add(
                conn,
                kind,
                subject,
                admin_dsn=db_dsn,
                password_file=tmp_path / f"{name}.pgpass",
                login=name,
            )
            conn.commit()
        made.append(name)
        return login_dsn(db_dsn, name)

    yield make
    with connect(db_dsn, autocommit=True) as conn:

        def gone() -> bool:
            """No session of these logins is left: a closed connection's server process
            drops its temporary objects as it exits, after the client has moved on, and
            until then DROP ROLE is refused (objects still depend on the role)."""
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = ANY ($1)", [made]
            ).fetchone()
            return row is not None and row[0] == 0

        wait_for(gone, "the logins' sessions ending")
        for name in made:
            roles.remove(conn, name)
