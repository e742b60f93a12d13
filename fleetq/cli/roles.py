"""`fleetq roles`: logins that act only as what they are (a runner, a submitter, an
operator, a reader), for fleets that span machines an operator does not fully trust."""

from __future__ import annotations

import argparse
from pathlib import Path

from fleetq.cli.common import Commands, add_json
from fleetq.cli.exits import Exit
from fleetq.cli.output import emit_json, table
from fleetq.core import migrate, roles
from fleetq.core.db import connect, resolve_dsn
from fleetq.core.text import escape

_WHAT = {
    roles.Kind.RUNNER: ("NODE/NAME", "a runner login: it acts only as this runner id"),
    roles.Kind.SUBMITTER: (
        "IDENTITY",
        "a submitter login: its jobs are submitted by IDENTITY (so is their priority class), "
        "and it may cancel only those",
    ),
    roles.Kind.OPERATOR: (
        "IDENTITY",
        "an operator login: cancels any job, drains, pauses and resumes runners, audited "
        "as IDENTITY; reads everything",
    ),
    roles.Kind.READER: ("NAME", "a read-only login (fleetq-console --readonly, stats, overlaps)"),
    roles.Kind.GATEWAY: (
        "NAME",
        "the HTTP API's login (fleetq api --dsn): it acts only for the holder of the API "
        "token a request presents (fleetq tokens), never on its own",
    ),
}


def register(commands: Commands) -> None:
    """Add `roles` and its verbs."""
    parser = commands.add_parser(
        "roles",
        help="create and list logins for runners, submitters, operators and readers",
        description="Logins for the groups fleetq's schema defines. Each login acts only as "
        "what it was made for: a runner login cannot act as another runner or touch tables; "
        "a submitter cannot choose who submitted. The password goes to a pgpass file (mode "
        "0600) that the printed DSN names (passfile=); copy both to the machine that uses "
        "them. The DSN reaches the server the way --dsn does: give the --dsn the other "
        "machines will use (for the embedded server, the tcp dsn of `fleetq server status`). "
        "Run these as an administrator (a superuser or a member of fleetq_owner).",
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for kind, (metavar, help_text) in _WHAT.items():
        add = verbs.add_parser(f"add-{kind.value}", help=help_text, description=help_text)
        add.add_argument("subject", metavar=metavar)
        add.add_argument("--login", help="the role's name (default: fleetq_KIND_SUBJECT)")
        add.add_argument(
            "--password-file",
            type=Path,
            help="where to write the password, pgpass format, mode 0600 (default: "
            "./LOGIN.pgpass; an existing file is never overwritten)",
        )
        add_json(add)
        add.set_defaults(func=_add, kind=kind)
    listing = verbs.add_parser("list", help="every fleetq login and what it acts as")
    add_json(listing)
    listing.set_defaults(func=_list)
    remove = verbs.add_parser("remove", help="drop a fleetq login")
    remove.add_argument("login")
    remove.set_defaults(func=_remove)


def _add(args: argparse.Namespace) -> int:
    kind: roles.Kind = args.kind
    roles.check_subject(kind, args.subject)
    login = args.login or roles.default_login(kind, args.subject)
    password_file = args.password_file or Path(f"{login}.pgpass")
    dsn = resolve_dsn(args.dsn)
    with connect(dsn) as conn:
        migrate.require_current(conn)
        created = roles.add(
            conn, kind, args.subject, admin_dsn=dsn, password_file=password_file, login=login
        )
        conn.commit()
    if args.json:
        emit_json(created)
        return 0
    print(f"login {escape(created.login.role_name)}: {kind.value} {escape(args.subject)}")
    print(f"password written to {created.password_file} (mode 0600); this DSN reads it:")
    print(created.dsn)
    return 0


def _list(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args.dsn)) as conn:
        migrate.require_current(conn)
        found = roles.logins(conn)
    if args.json:
        emit_json(found)
        return 0
    print(table(["login", "kind", "acts as"], [[x.role_name, x.kind, x.subject] for x in found]))
    return 0


def _remove(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args.dsn)) as conn:
        migrate.require_current(conn)
        removed = roles.remove(conn, args.login)
        conn.commit()
    login = escape(args.login)
    print(f"login {login} dropped" if removed else f"no fleetq login named {login}")
    return Exit.OK if removed else Exit.DATA
