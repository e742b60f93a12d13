"""`fleetq api --listen HOST:PORT`: the HTTP producer API (fleetq/api)."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from fleetq.cli.common import Commands, positive_arg
from fleetq.core import extras, migrate
from fleetq.core.db import connect, resolve_dsn
from fleetq.core.errors import ConnectionFailed, DatabaseBusy, InvalidInput


def register(commands: Commands) -> None:
    """Add `api`."""
    p = commands.add_parser(
        "api",
        help="serve the HTTP API (submit, status, result, cancel, health; runners' calls)",
        description="Serve the HTTP API: POST /v1/jobs (submit; Idempotency-Key and "
        "traceparent headers), GET /v1/jobs/ID, POST /v1/jobs/ID/cancel, GET "
        "/v1/results/PROJECT/COMMIT, GET /v1/whoami, GET /v1/health; for runner tokens "
        "(fleetq-runner --api) POST /v1/runner/calls and GET /v1/runner/wake; the OpenAPI "
        "document at /openapi.json (no /docs page: it would load Swagger UI from a CDN). One "
        "access log line per request on stderr (method, path, status, ms, the token's "
        "identity; never the token; a runner's calls that went well only with -v). Every "
        "call but health needs `Authorization: Bearer <token>` (fleetq tokens add) and acts "
        "as the token's identity. --dsn is best a gateway login (fleetq roles add-gateway), "
        "which can act only for a presented token; an administrator's DSN works too.",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="address to serve on (default 127.0.0.1:8080; port 0 picks a free one)",
    )
    p.add_argument(
        "--max-body",
        type=positive_arg,
        default=256 * 1024,
        metavar="BYTES",
        help="refuse request bodies over this size with 413 (default 262144)",
    )
    p.add_argument(
        "--max-runner-body",
        type=positive_arg,
        default=16 * 1024 * 1024,
        metavar="BYTES",
        help="the same for a runner's calls (default 16777216: a batch of 256 outcomes "
        "with their log tails)",
    )
    p.add_argument(
        "--max-connections",
        type=positive_arg,
        default=200,
        metavar="N",
        help="answer 503 beyond this many concurrent connections (default 200)",
    )
    p.add_argument(
        "--pool-size",
        type=positive_arg,
        default=10,
        metavar="N",
        help="database connections at most (default 10)",
    )
    p.add_argument(
        "--pgbouncer",
        action="store_true",
        help="--dsn names PgBouncer in transaction mode: keep no prepared statements "
        "between requests (needs --session-dsn)",
    )
    p.add_argument(
        "--session-dsn",
        metavar="DSN",
        help="a DSN straight to PostgreSQL for the one LISTEN connection that wakes runners "
        "(default: --dsn; PgBouncer in transaction mode cannot carry LISTEN)",
    )
    p.add_argument(
        "--tls-cert",
        type=Path,
        metavar="PEM",
        help="serve HTTPS with this certificate (and --tls-key); without them the API "
        "speaks plain HTTP, for a TLS terminator in front of it",
    )
    p.add_argument("--tls-key", type=Path, metavar="PEM", help="the key of --tls-cert")
    p.set_defaults(func=_serve)


def listen_address(text: str) -> tuple[str, int]:
    """HOST:PORT, [IPv6]:PORT."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidInput(f"--listen {text!r}: give HOST:PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]"), int(port)


def listening_socket(host: str, port: int, shown: str) -> socket.socket:
    """A TCP socket listening on host:port (port 0: a free one), so the address is known
    before the server starts and a client's connection waits in the backlog."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says
    # TCP, and without it every keep-alive response waited ~40 ms on Nagle and the
    # client's delayed ACK (measured: 44 ms p50 per request, 1.3 ms with it)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise InvalidInput(f"--listen {shown}: cannot listen there: {exc.strerror}") from None
    return sock


def _serve(args: argparse.Namespace) -> int:
    import logging

    extras.require("api", "fleetq api")
    import uvicorn  # the ASGI server loads only for this command

    from fleetq.api.app import create_app
    from fleetq.api.gateway import Gateway

    host, port = listen_address(args.listen)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise InvalidInput("give --tls-cert and --tls-key together (or neither: plain HTTP)")
    for pem in (args.tls_cert, args.tls_key):
        if pem is not None and not pem.is_file():
            raise InvalidInput(f"{pem}: no such file")
    if args.pgbouncer and not args.session_dsn:
        raise InvalidInput(
            "--pgbouncer needs --session-dsn: the LISTEN connection that wakes runners "
            "needs a session of its own, which PgBouncer in transaction mode does not keep"
        )
    dsn = resolve_dsn(args.dsn)
    try:
        with connect(dsn) as conn:  # a wrong database is refused now, with the fix named
            migrate.require_current(conn)
    except (ConnectionFailed, DatabaseBusy) as exc:
        # a service may start before its database answers: 503 until it does (the
        # schema is checked then, fleetq/api/gateway.py)
        print(f"fleetq api: the database is out of reach ({exc}); serving 503 until it answers")
    sock = listening_socket(host, port, args.listen)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if sock.family == socket.AF_INET6 else host
    gateway = Gateway(
        dsn, pool_size=args.pool_size, pgbouncer=args.pgbouncer, session_dsn=args.session_dsn
    )
    app = create_app(gateway, max_body=args.max_body, max_runner_body=args.max_runner_body)
    # the API's access log (fleetq/api/access.py) is at INFO: shown without -v too, and
    # it is the only one (uvicorn's would repeat each line, without the identity)
    # (runners' calls that went well at DEBUG: shown with -v)
    logging.getLogger("fleetq.api").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    config = uvicorn.Config(
        app,
        log_level="info" if args.verbose else "warning",
        access_log=False,
        limit_concurrency=args.max_connections,
        timeout_keep_alive=5,
        server_header=False,
        use_colors=False,  # stderr is escaped (cli/output.terminal): colour codes would show
        ssl_certfile=args.tls_cert,
        ssl_keyfile=args.tls_key,
    )
    scheme = "https" if args.tls_cert else "http"
    print(
        f"fleetq api: listening on {scheme}://{shown}:{bound} (OpenAPI at /openapi.json)",
        flush=True,
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0
