"""`fleetq demo` runs in a database of its own, one demo at a time (issue 42).

The user's database (the one the DSN names) is only read, to learn the server and the
name; the demo's database beside it is created on first use, and its run lock is a
table lock no other login can take (issue 41's rule), where it was an advisory key.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from fleetq.cli.exits import Exit
from fleetq.core.db import connect
from fleetq.core.errors import RefusedNow
from fleetq.demo import database, session
from tests.integration.conftest import Cli, login_dsn


def _name(dsn: str) -> str:
    return str(conninfo_to_dict(dsn)["dbname"])


def test_the_demo_runs_beside_the_given_database_never_in_it(db_dsn: str, demo_dsn: str) -> None:
    with database.exclusive(db_dsn) as demo:
        assert (demo.given, demo.name, demo.created) == (_name(db_dsn), _name(demo_dsn), True)
        with connect(demo.dsn) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == (_name(demo_dsn),)
    with database.exclusive(db_dsn) as again:
        assert (again.name, again.created) == (demo.name, False)
    with connect(db_dsn) as conn:  # nothing of the demo's in the given database
        assert conn.execute("SELECT to_regnamespace('fleetq_demo')").fetchone() == (None,)


def test_a_second_demo_is_refused_for_now_until_the_first_ends(
    db_dsn: str, demo_dsn: str, cli: Cli
) -> None:
    with database.exclusive(db_dsn) as demo:
        with (
            pytest.raises(
                RefusedNow,
                match=rf"another fleetq demo is running in database "
                rf"'{demo.name}' \(held by fleetq demo pid {os.getpid()}\)",
            ),
            database.exclusive(db_dsn),
        ):
            pass
        code, _, err = cli("demo", "--headless")
        assert code == 75, err  # Exit.TEMPFAIL
        assert "another fleetq demo is running" in err and "Traceback" not in err
    with database.exclusive(db_dsn):  # given back at the block's end
        pass


def test_the_old_advisory_key_held_by_anyone_delays_no_demo(db_dsn: str, demo_dsn: str) -> None:
    old_key = 0x666C_6565_7472  # the key the demo's run lock used to be
    with connect(db_dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock($1)", [old_key])
        with database.exclusive(db_dsn) as demo, connect(demo.dsn, autocommit=True) as other:
            other.execute("SELECT pg_advisory_lock($1)", [old_key])  # in its database too
        with database.exclusive(db_dsn):
            pass


@pytest.fixture
def stranger(db_dsn: str) -> Iterator[str]:
    """A login with no role in fleetq at all (roles are the whole server's: unique name);
    dropping what it owns takes back its grants on databases too."""
    name = f"fq_stranger_{uuid.uuid4().hex[:10]}"
    with connect(db_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{name}" LOGIN'.encode())
    yield name
    with connect(db_dsn, autocommit=True) as conn:
        conn.execute(f'DROP OWNED BY "{name}"'.encode())
        conn.execute(f'DROP ROLE "{name}"'.encode())


def test_no_other_login_can_take_the_demo_lock(db_dsn: str, demo_dsn: str, stranger: str) -> None:
    with database.exclusive(db_dsn):
        pass  # the demo database and its lock table exist now
    with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
        psycopg.connect(login_dsn(demo_dsn, stranger), connect_timeout=10).close()
    # even let in, it may lock nothing of the demo's
    with connect(demo_dsn, autocommit=True) as admin:
        admin.execute(f'GRANT CONNECT ON DATABASE "{_name(demo_dsn)}" TO "{stranger}"'.encode())
    with psycopg.connect(login_dsn(demo_dsn, stranger), connect_timeout=10) as conn:
        for mode in ("ACCESS SHARE", "ROW SHARE", "EXCLUSIVE"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"LOCK TABLE fleetq_demo.run_lock IN {mode} MODE NOWAIT".encode())
            conn.rollback()


def test_a_long_database_name_gets_a_demo_database_of_its_own() -> None:
    assert database.demo_name("fleetq") == "fleetq_demo"
    long_a, long_b = "a" * 60 + "x", "a" * 60 + "y"
    names = {database.demo_name(long_a), database.demo_name(long_b)}
    assert len(names) == 2
    assert all(len(n.encode()) <= 63 and n.endswith("_demo") for n in names)
    assert database.demo_name("é" * 40).endswith("_demo")  # cut on a character boundary


def test_ctrl_c_is_the_clis_interrupted_status() -> None:
    assert session.INTERRUPTED == int(Exit.INTERRUPTED) == 130
