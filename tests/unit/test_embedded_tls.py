"""The embedded server's TLS-only pg_hba and the names its certificate carries."""

from __future__ import annotations

import socket

from fleetq.core.embedded import certificate_names, tls_only_hba

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


def test_tls_only_hba_keeps_no_plain_tcp_line_and_is_idempotent() -> None:
    after = tls_only_hba(BEFORE_TLS)
    kinds = [line.split()[0] for line in after.splitlines() if line and line[0] != "#"]
    assert kinds == ["local", "local", "hostssl", "hostssl"]
    assert after.count("# fleetq:") == 1
    assert "hostssl all all 0.0.0.0/0 scram-sha-256" in after
    assert "hostssl all all ::/0 scram-sha-256" in after
    assert tls_only_hba(after) == after


def test_certificate_names_fit_the_listen_host() -> None:
    assert certificate_names("10.1.2.3") == ["10.1.2.3", "localhost", "127.0.0.1", "::1"]
    assert certificate_names("db.example.org")[0] == "db.example.org"
    wildcard = certificate_names("0.0.0.0")  # noqa: S104 - the point
    assert wildcard[0] == socket.gethostname() and "localhost" in wildcard
    assert certificate_names("a/b,c=d") == ["localhost", "127.0.0.1", "::1"]  # no subject
