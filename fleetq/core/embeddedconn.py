"""How the embedded server is reached, as functions of their arguments: its DSNs, the
`--listen` address, pg_hba's one TCP line, the certificate's names and fingerprint.

Why apart from `embedded`: none of this reads or changes a server's state, so the server
manager, its certificate and its TLS front share it, and tests check it on its own.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import socket
import ssl
from pathlib import Path
from urllib.parse import quote

from fleetq.core.errors import EmbeddedServerError

DATABASE = "fleetq"
SUPERUSER = "postgres"
LOOPBACK = "127.0.0.1"  # where the server listens for its TLS front
_WILDCARDS = ("*", "0.0.0.0", "::", "")  # noqa: S104 - listen_addresses' "every address"
_DNS_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")  # no "," "/" "="
_FLEETQ_HBA = (
    "# fleetq: TCP clients (--listen) come through fleetq's TLS front, which reaches the",
    "# fleetq: server on loopback; every login authenticates with its password",
    f"host all all {LOOPBACK}/32 scram-sha-256",
)


def socket_dsn(socket_dir: Path, port: int, database: str = DATABASE) -> str:
    """A libpq/asyncpg URI for a server reached through its Unix socket."""
    return f"postgresql://{SUPERUSER}@/{database}?host={quote(str(socket_dir))}&port={port}"


def parse_listen(value: str) -> tuple[str, int]:
    """Split "HOST:PORT" (IPv6 as "[::1]:PORT"), with a message that says what is wrong."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EmbeddedServerError(f"--listen wants HOST:PORT (e.g. 0.0.0.0:6543), got {value!r}")
    return host, int(port)


def front_only_hba(text: str) -> str:
    """pg_hba.conf whose one TCP line is the TLS front's: every `host`, `hostssl` and
    `hostnossl` line removed (fleetq's own of old, initdb's, any other), then fleetq's
    loopback line at the end. Idempotent: the result maps to itself."""
    kept = []
    for line in text.splitlines():
        fields = tuple(line.split())
        if fields[:1] in (("host",), ("hostssl",), ("hostnossl",)):
            continue
        if line.startswith("# fleetq:"):
            continue
        kept.append(line)
    while kept and not kept[-1].strip():
        kept.pop()
    return "\n".join([*kept, "", *_FLEETQ_HBA]) + "\n"


def certificate_names(host: str) -> list[str]:
    """What the certificate names, the first as its subject: the listen host (each of a
    comma-separated list), or for a wildcard this machine's names; always the loopback
    names too, so `localhost` (the host a wildcard's DSN shows) verifies."""
    names: list[str] = []
    for part in (p.strip() for p in host.split(",")):
        if part in _WILDCARDS:
            names += [socket.gethostname(), socket.getfqdn()]
        else:
            names.append(part)
    names += ["localhost", "127.0.0.1", "::1"]
    fit = [n for n in names if _is_ip(n) or _DNS_NAME.match(n)]
    return list(dict.fromkeys(fit))


def subject_alt_name(names: list[str]) -> str:
    """openssl's `subjectAltName=` value for `names` (IP or DNS entries)."""
    return ",".join(f"IP:{n}" if _is_ip(n) else f"DNS:{n}" for n in names)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def fingerprint(pem: str) -> str:
    """The SHA-256 of a PEM certificate's DER form, as `AB:CD:…`."""
    digest = hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def port_free(port: int) -> bool:
    """Whether the server could bind `port` on loopback now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True
