"""The embedded server's pg_hba under its TLS front, and the names its certificate carries."""

from __future__ import annotations

import socket

from fleetq.core.embeddedconn import certificate_names, front_only_hba

# initdb's lines (--auth-local=trust --auth-host=scram-sha-256), then fleetq's before TLS
BEFORE_TLS = """\
# TYPE  DATABASE        USER            ADDRESS                 METHOD
local   all             all                                     trust
host    all             all             127.0.0.1/32            scram-sha-256
host    all             all             ::1/128                 scram-sha-256
local   replication     all                                     trust
host    replication     all             127.0.0.1/32            scram-sha-256
hostnossl all           all             10.0.0.0/8              scram-sha-256

# fleetq: TCP clients (--listen) authenticate with HOME/password
host all all 0.0.0.0/0 scram-sha-256
host all all ::/0 scram-sha-256
"""


def test_front_only_hba_keeps_one_loopback_tcp_line_and_is_idempotent() -> None:
    """Behind the TLS front the server's one TCP line is loopback with a password: any
    other (initdb's, fleetq's of old letting every address in, an operator's) would let
    a client past the front in clear."""
    after = front_only_hba(BEFORE_TLS)
    tcp = [line.split() for line in after.splitlines() if line.startswith("host")]
    assert tcp == [["host", "all", "all", "127.0.0.1/32", "scram-sha-256"]]
    kinds = [line.split()[0] for line in after.splitlines() if line and line[0] != "#"]
    assert kinds == ["local", "local", "host"]
    assert front_only_hba(after) == after
    after_hostssl = front_only_hba(after.replace("host all", "hostssl all"))
    assert after_hostssl == after


def test_certificate_names_fit_the_listen_host() -> None:
    assert certificate_names("10.1.2.3") == ["10.1.2.3", "localhost", "127.0.0.1", "::1"]
    assert certificate_names("db.example.org")[0] == "db.example.org"
    wildcard = certificate_names("0.0.0.0")  # noqa: S104 - the point
    assert wildcard[0] == socket.gethostname() and "localhost" in wildcard
    assert certificate_names("a/b,c=d") == ["localhost", "127.0.0.1", "::1"]  # no subject
