"""`fleetq server status|start|stop`: the embedded PostgreSQL shared by this machine."""

from __future__ import annotations

import argparse

from fleetq.cli.output import emit_json
from fleetq.core.embedded import EmbeddedServer, ServerStatus


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `server` and its verbs."""
    server = commands.add_parser(
        "server",
        help="manage the embedded PostgreSQL server",
        description=(
            "The embedded PostgreSQL server lives in $FLEETQ_HOME (default: the user's data "
            "directory; /var/lib/fleetq as root). Every fleetq process on this machine that "
            "is given no --dsn / FLEETQ_DSN shares it; it runs until `fleetq server stop`."
        ),
    )
    verbs = server.add_subparsers(dest="verb", required=True, metavar="VERB")
    status = verbs.add_parser("status", help="say whether it runs and print its DSN")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    _add_show_password(status)
    status.set_defaults(func=_status)
    start = verbs.add_parser("start", help="start it (or reuse the running one)")
    start.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="also accept TCP connections, over TLS only (served by fleetq's TLS front "
        "beside the server; a self-signed certificate made once in the data directory; "
        "password auth), so runners on other nodes can join",
    )
    start.add_argument("--json", action="store_true", help="machine-readable output")
    _add_show_password(start)
    start.set_defaults(func=_start)
    stop = verbs.add_parser("stop", help="stop it (fast shutdown)")
    stop.set_defaults(func=_stop)


def _add_show_password(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--show-password",
        action="store_true",
        help="also print the TCP DSN with the superuser's password in it (by default the "
        "DSN names a pgpass file instead; remote runners should get logins of their own: "
        "fleetq roles add-runner)",
    )


def _status(args: argparse.Namespace) -> int:
    server = EmbeddedServer()
    status = server.status()
    _show(status, args.json)
    _password(server, args)
    return 0 if status.running else 3  # 3, like pg_ctl status: not running


def _start(args: argparse.Namespace) -> int:
    server = EmbeddedServer()
    _show(server.ensure_running(listen=args.listen), args.json)
    _password(server, args)
    return 0


def _password(server: EmbeddedServer, args: argparse.Namespace) -> None:
    if args.show_password and not args.json and (dsn := server.tcp_dsn_with_password()):
        print(f"tcp dsn with password: {dsn}")


def _stop(_: argparse.Namespace) -> int:
    stopped = EmbeddedServer().stop()
    print("embedded server stopped" if stopped else "embedded server was not running")
    return 0


def _show(status: ServerStatus, as_json: bool) -> None:
    if as_json:
        emit_json(status)
        return
    print(f"home:     {status.home}")
    print(f"version:  PostgreSQL {status.version}")
    if not status.running:
        print("state:    stopped (`fleetq server start`, or any fleetq command, starts it)")
        return
    print(f"state:    running (pid {status.pid})")
    print(f"dsn:      {status.dsn}")
    if status.tcp_dsn:
        print(f"tcp dsn:  {status.tcp_dsn}")
        print(
            f"listen:   {status.listen}  (password in {status.home / 'password'}; "
            "--show-password prints it; remote runners: fleetq roles add-runner)"
        )
    if status.front_down:
        print(
            f"listen:   {status.front_down} is not served: its TLS front stopped "
            f"(log: {status.home / 'log' / 'front.log'}); `fleetq server start --listen "
            f"{status.front_down}` starts it again"
        )
    if status.certificate:
        print(f"tls:      {status.certificate} (self-signed unless replaced)")
        print(f"          SHA-256 {status.fingerprint}")
        print(
            "          to verify the server, copy the certificate to the client, check its "
            "fingerprint, and use sslmode=verify-full&sslrootcert=<the copy> in the DSN"
        )
