"""Connections, and the boundary where driver errors become fleetq errors.

The CLI and producers use psycopg 3 (with `RawCursor`, so the `$n` SQL blocks run as
written); runners and the console will use asyncpg through the same blocks. This module
holds no business logic: it opens connections and maps exceptions, with the cause chained.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from typing import TypeAlias
from urllib.parse import parse_qs, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import TupleRow
from psycopg.types.json import set_json_loads

from fleetq.core.errors import (
    BY_SQLSTATE,
    ConfigError,
    ConnectionFailed,
    DatabaseBusy,
    FleetqError,
    ReadOnlyServer,
)

SyncConnection: TypeAlias = psycopg.Connection[TupleRow]

CONNECT_TIMEOUT_S = 10
STATEMENT_TIMEOUT_MS = 30_000
# fleetq reads dependencies live and refuses endings at REPEATABLE READ or SERIALIZABLE
# (fleetq.require_read_committed): its sessions say READ COMMITTED whatever the database's
# or the role's default is (a runner DSN's own setting still wins, and is refused)
READ_COMMITTED = {"default_transaction_isolation": "read committed"}
READ_COMMITTED_OPTION = r"-c default_transaction_isolation=read\ committed"


class UnreadableJSON(str):
    """A JSON value PostgreSQL stored and Python cannot read (an integer of thousands of
    digits, nesting past the interpreter's recursion limit): a string saying so.

    Why: one such value raised while a row was decoded, so a runner claiming a batch
    with one poison payload in it lost the whole batch and exited, and did so again on
    every restart, and `fleetq jobs` exited 70. Decoded to this, the row reads: readers
    show the string, and the claim's model, which wants an object, refuses that row
    alone (the runner ends that job `refused`, saying why)."""

    __slots__ = ()

    @property
    def why(self) -> str:
        return self[1:-1]


def read_json(text: str | bytes) -> object:
    """`json.loads`, or `UnreadableJSON` where Python cannot hold what was stored."""
    try:
        return json.loads(text)
    except RecursionError:
        return UnreadableJSON("<JSON nested too deeply to read>")
    except ValueError as exc:
        return UnreadableJSON(f"<JSON Python cannot read: {str(exc).split(';')[0][:120]}>")


def resolve_dsn(explicit: str | None = None) -> str:
    """`--dsn`, else `$FLEETQ_DSN`, else the embedded server (started on first use). A
    DSN given by a person is checked first: a malformed one is a `ConfigError` saying
    what is wrong, not a driver's traceback later."""
    if explicit:
        return writable(check_dsn(explicit, "--dsn"))
    if env := os.environ.get("FLEETQ_DSN"):
        return writable(check_dsn(env, "FLEETQ_DSN"))
    from fleetq.core.embedded import EmbeddedServer  # only when no server was named

    dsn = EmbeddedServer().ensure_running().dsn
    assert dsn is not None  # ensure_running raises when it cannot provide one
    return dsn


def writable(dsn: str) -> str:
    """`dsn`, asking for a server that accepts writes (`target_session_attrs=read-write`)
    unless it, or `PGTARGETSESSIONATTRS`, asks for something else.

    Why: with a primary and its standbys listed (`host=db1,db2`, or
    `postgresql://db1,db2/fleetq`), libpq and asyncpg otherwise take the first host that
    answers, a standby included, where every write fails; with it they skip standbys and,
    after a failover, find the promoted one. Every fleetq process connects through this."""
    if os.environ.get("PGTARGETSESSIONATTRS") or "target_session_attrs" in dsn_settings(dsn):
        return dsn
    if "://" in dsn:
        parts = urlsplit(dsn)
        query = f"{parts.query}&" if parts.query else ""
        return urlunsplit(parts._replace(query=f"{query}target_session_attrs=read-write"))
    return make_conninfo(dsn, target_session_attrs="read-write")


def target_session_attrs(dsn: str) -> str:
    """The kind of server a DSN asks for, as libpq and asyncpg read it: its own
    `target_session_attrs`, else `PGTARGETSESSIONATTRS`, else any."""
    given = parse_qs(urlsplit(as_uri(dsn)).query).get("target_session_attrs", [""])[-1]
    return given or os.environ.get("PGTARGETSESSIONATTRS") or "any"


def check_dsn(dsn: str, where: str = "the DSN") -> str:
    """`dsn` if libpq and asyncpg can both read it; else a ConfigError naming the fault
    (an unknown option, a port that is not a number), never echoing a password."""
    from psycopg.conninfo import conninfo_to_dict

    if "://" in dsn:
        # a URI: its query may carry session settings (?lock_timeout=2000) that libpq
        # does not know but asyncpg passes on, so only its shape and ports are checked
        parts = urlsplit(dsn)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ConfigError(f"{where}: a URI starts postgresql:// (got {parts.scheme}://)")
        hosts = parts.netloc.rpartition("@")[2]
        ports = [h.rpartition("]")[2].rpartition(":")[2] for h in hosts.split(",") if ":" in h]
        ports += parse_qs(parts.query).get("port", [""])[0].split(",")
    else:
        try:
            params = conninfo_to_dict(dsn)
        except psycopg.Error as exc:
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"{where} is not a valid PostgreSQL DSN: {first_line}") from None
        ports = str(params.get("port") or "").split(",")
    for port in ports:
        if port and not port.isdigit():
            raise ConfigError(f"{where}: port {port!r} is not a number")
    return dsn


def as_uri(dsn: str) -> str:
    """A `postgresql://` URI for any libpq DSN: asyncpg reads URIs only, while psycopg,
    psql and operators also use `host=... dbname=...` strings."""
    if "://" in dsn:
        return dsn
    from psycopg.conninfo import conninfo_to_dict

    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    user = quote(params.pop("user", ""), safe="")
    password = params.pop("password", None)
    auth = f"{user}:{quote(password, safe='')}@" if password else (f"{user}@" if user else "")
    database = quote(params.pop("dbname", ""), safe="")
    query = "&".join(f"{quote(k)}={quote(v, safe='/')}" for k, v in sorted(params.items()))
    return f"postgresql://{auth}/{database}" + (f"?{query}" if query else "")


def each_host(uri: str) -> list[str]:
    """A URI per host of a multi-host URI (`postgresql://u@db1:5432,db2/q`, or
    `?host=/a,/b&port=5432,5433`), in order, each naming one host in its query; `[uri]`
    when it names one host or none. For clients that give each host a timeout of its own
    (`driver.connect_each_host`), as libpq does."""
    parts = urlsplit(uri)
    query = parse_qs(parts.query, keep_blank_values=True)
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    if hostlist:
        hosts, ports = [], []
        for item in hostlist.split(","):
            if item.startswith("["):  # [IPv6]:port
                host, _, port = item[1:].partition("]")
                port = port.removeprefix(":")
            else:
                host, _, port = item.partition(":")
            hosts.append(host)
            ports.append(port)
    else:
        hosts = query.get("host", [""])[-1].split(",")
        ports = query.get("port", [""])[-1].split(",")
    if len(hosts) < 2:
        return [uri]
    if len(ports) == 1:
        ports = ports * len(hosts)
    rest = {k: v[-1] for k, v in query.items() if k not in ("host", "port")}
    netloc = f"{userinfo}@" if userinfo else ""
    found = []
    for host, port in zip(hosts, ports, strict=False):
        one = {"host": host, **({"port": port} if port else {}), **rest}
        found.append(urlunsplit(parts._replace(netloc=netloc, query=urlencode(one, safe="/"))))
    return found


def dsn_settings(dsn: str) -> set[str]:
    """Names given in a DSN's query (`?lock_timeout=2000&…`): asyncpg sends those that
    are not connection parameters as session settings, and they then win over a
    program's defaults."""
    return set(parse_qs(urlsplit(as_uri(dsn)).query))


def with_database(dsn: str, database: str) -> str:
    """The same server, another database (URI or key=value DSNs alike)."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        return urlunsplit(parts._replace(path="/" + quote(database, safe="")))
    return make_conninfo(dsn, dbname=database)


def read_only_message(exc: object) -> str:
    """What a write refused by a read-only server says, with what to do about it."""
    return (
        f"the database server is read-only (a standby, or a primary being demoted): {exc}; "
        "retry once the failover is done, with the primary and its standbys all listed in "
        "the DSN (host=db1,db2): fleetq connects with target_session_attrs=read-write"
    )


# What the server answers a connection whose DSN names a database or a role it does not
# have (libpq reports it as a message only, with no SQLSTATE)
_MISNAMED = re.compile(r'(database|role) "[^"]*" does not exist')


def misnamed(exc: BaseException) -> bool:
    """Whether a failed connection's DSN names a database or role the server lacks
    (asyncpg says so by SQLSTATE: 3D000, 28000; libpq by message only)."""
    if getattr(exc, "sqlstate", None) in ("3D000", "28000"):
        return True
    return isinstance(exc, psycopg.OperationalError) and bool(_MISNAMED.search(str(exc)))


@contextlib.contextmanager
def wrap_errors() -> Iterator[None]:
    """Turn driver exceptions into `core.errors`, keeping the original as the cause."""
    try:
        yield
    except psycopg.Error as exc:
        if (known := BY_SQLSTATE.get(exc.sqlstate or "")) is not None:
            raise known(str(exc.diag.message_primary or exc)) from exc
        raise _general(exc) from exc


# lock_not_available (lock_timeout), serialization_failure, deadlock_detected
BUSY_STATES = frozenset({"55P03", "40001", "40P01"})


def busy(sqlstate: object) -> bool:
    """Whether the server refused for now: a lock, a conflict, or resources (class 53)."""
    return isinstance(sqlstate, str) and (sqlstate in BUSY_STATES or sqlstate[:2] == "53")


def _general(exc: psycopg.Error) -> FleetqError:
    """A driver error fleetq's protocol did not raise (a refusal of its own, such as a
    table this login may not touch, is in BY_SQLSTATE), by its kind."""
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return ReadOnlyServer(read_only_message(exc))
    if busy(exc.sqlstate):  # before OperationalError: a lock timeout is not an outage
        return DatabaseBusy(f"database busy: {exc.diag.message_primary or exc}")
    if isinstance(exc, psycopg.OperationalError):
        if misnamed(exc):  # the DSN is wrong: retrying will not help
            return ConfigError(f"the DSN names what the server does not have: {exc}")
        return ConnectionFailed(f"database unreachable or connection lost: {exc}")
    return FleetqError(f"database error: {exc}")


@contextlib.contextmanager
def connect(dsn: str, *, autocommit: bool = False) -> Iterator[SyncConnection]:
    """A psycopg connection whose cursors take `$n` placeholders, with timeouts set so a
    wedged server or lock surfaces as an error, not a hang."""
    with wrap_errors():
        conn = psycopg.connect(
            dsn,
            autocommit=autocommit,
            connect_timeout=CONNECT_TIMEOUT_S,
            cursor_factory=psycopg.RawCursor,
            options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS} {READ_COMMITTED_OPTION}",
            application_name="fleetq",
        )
        set_json_loads(read_json, conn)
        with conn:
            yield conn
