"""A primary and a streaming standby built from the bundled PostgreSQL programs, for the
failover tests: `pg_basebackup -R` makes the standby, `pg_ctl promote` ends its recovery,
and the primary dies as a machine does (every process of it killed with SIGKILL at once).

Both are `EmbeddedServer`s in homes of their own, so as root they run as the server user
and reach each other through their Unix sockets (trust auth, replication included).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psycopg

from fleetq.core.embedded import SOCKET_PORT, EmbeddedServer
from fleetq.core.embeddedconn import socket_dsn
from fleetq.core.embeddedhost import private_socket_dir, read_postmaster
from tests.conftest import FAST, make_home

# Durable enough to mean something: commits wait for their WAL (and, with a synchronous
# standby, for the standby's flush of it). fsync stays off: the kill takes processes, not
# the machine's page cache, and the dead primary is never started again.
SETTINGS = {**FAST, "synchronous_commit": "on", "wal_level": "replica", "max_wal_senders": "4"}


class Node(EmbeddedServer):
    """One server of the pair: started and read through its socket, whatever its role
    (`EmbeddedServer.ensure_running` expects a primary: it may create the database)."""

    killed = False

    def dsn(self, database: str = "fleetq") -> str:
        return socket_dsn(self.socket_dir, SOCKET_PORT, database)

    @property
    def socket_dir(self) -> Path:
        return private_socket_dir(self.home, SOCKET_PORT, as_root=os.geteuid() == 0)

    def start(self) -> None:
        self._make_home()
        self._start(None)

    def base_backup_of(self, primary: Node) -> None:
        """Make this node's data directory a standby of `primary` (`-R`: it follows the
        primary from the backup's end, over the primary's socket)."""
        self._make_home()
        self.pgdata.mkdir(mode=0o700)
        self.log_dir.mkdir(mode=0o700)
        for directory in (self.pgdata, self.log_dir):
            self._give_to_server(directory)
        self.programs.run(
            [
                "pg_basebackup",
                "-D",
                str(self.pgdata),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "-h",
                str(primary.socket_dir),
                "-p",
                str(SOCKET_PORT),
                "-U",
                "postgres",
            ]
        )

    def promote(self) -> None:
        self.programs.run(["pg_ctl", "promote", "-D", str(self.pgdata), "-w", "-t", "60"])

    def kill(self) -> None:
        """SIGKILL the postmaster and every process it started, at once: the machine died
        (nothing is flushed, no client is told, no standby is sent another byte)."""
        self._signal_all(signal.SIGKILL)
        self.killed = True  # its pid file stays, naming a process that may linger unreaped

    def freeze(self) -> None:
        """SIGSTOP the postmaster and every process it started: the machine hangs (a
        paused VM, a partition that drops packets). Connections neither answer nor are
        refused; `kill` still ends them."""
        self._signal_all(signal.SIGSTOP)

    def _signal_all(self, sig: signal.Signals) -> None:
        found = read_postmaster(self.pgdata)
        assert found is not None, "the node is not running"
        pid = found[0]
        for victim in (pid, *_children(pid)):
            with suppress(ProcessLookupError):  # gone with its parent already
                os.kill(victim, sig)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")"
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found.append(int(entry.name))
    return found


class Pair:
    """A primary with one streaming standby; `fleet_dsn` lists both hosts, so clients
    that ask for a read-write server follow a failover."""

    def __init__(self, primary: Node, standby: Node) -> None:
        self.primary, self.standby = primary, standby

    @property
    def fleet_dsn(self) -> str:
        """Both hosts, the standby first: a client that took the first host to answer
        would then write to a standby, so only `target_session_attrs=read-write` (which
        fleetq adds, `db.writable`) makes a fleet on this DSN work at all."""
        return self._dsn(self.standby, self.primary)

    @property
    def primary_first_dsn(self) -> str:
        """Both hosts, the primary first: after the primary hangs, a client must give up
        on it, host by host, to reach the promoted standby."""
        return self._dsn(self.primary, self.standby)

    @staticmethod
    def _dsn(*nodes: Node) -> str:
        hosts = ",".join(str(node.socket_dir) for node in nodes)
        ports = ",".join(str(SOCKET_PORT) for _ in nodes)
        return f"postgresql://postgres@/fleetq?host={hosts}&port={ports}"

    def walsender_pid(self) -> int:
        """The primary's WAL sender to the standby."""
        with psycopg.connect(self.primary.dsn("postgres"), autocommit=True) as conn:
            row = conn.execute("SELECT pid FROM pg_stat_replication").fetchone()
        assert row is not None, "the primary has no WAL sender"
        return int(row[0])

    def wait_streaming(self, *, sync: bool, deadline_s: float = 30) -> None:
        """Until the primary sees the standby streaming (and, if `sync`, as synchronous)."""
        wanted = "sync" if sync else "async"
        end = time.monotonic() + deadline_s
        with psycopg.connect(self.primary.dsn("postgres"), autocommit=True) as conn:
            while time.monotonic() < end:
                row = conn.execute("SELECT state, sync_state FROM pg_stat_replication").fetchone()
                if row == ("streaming", wanted):
                    return
                time.sleep(0.05)
        raise AssertionError(f"the standby is not streaming as {wanted} after {deadline_s}s")


@contextmanager
def replicated_pair(*, sync: bool) -> Iterator[Pair]:
    """A primary (database `fleetq` made) and a standby following it, synchronously
    (`synchronous_standby_names = '*'`: a commit returns once the standby has flushed its
    WAL) or not; both stopped and removed afterwards."""
    homes = [make_home(), make_home()]
    primary, standby = Node(homes[0], settings=SETTINGS), Node(homes[1], settings=SETTINGS)
    try:
        primary.ensure_running()  # initdb, start, CREATE DATABASE fleetq
        standby.base_backup_of(primary)
        standby.start()
        pair = Pair(primary, standby)
        pair.wait_streaming(sync=False)
        if sync:  # only now: with no standby yet, every commit would wait for ever
            with psycopg.connect(primary.dsn("postgres"), autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                conn.execute("SELECT pg_reload_conf()")
            pair.wait_streaming(sync=True)
        yield pair
    finally:
        for node in (standby, primary):
            if not node.killed and read_postmaster(node.pgdata) is not None:
                node.stop("immediate")
        for home in homes:
            shutil.rmtree(home, ignore_errors=True)
