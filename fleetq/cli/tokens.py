"""`fleetq tokens`: bearer tokens for the HTTP API (`fleetq api`), each standing for a
submitter, operator or reader identity, or for one runner id."""

from __future__ import annotations

import argparse
import getpass
from pathlib import Path

from fleetq.cli.common import Commands, add_json
from fleetq.cli.exits import Exit
from fleetq.cli.output import emit_json, table
from fleetq.core import migrate, tokens
from fleetq.core.db import connect, resolve_dsn
from fleetq.core.roles import Kind
from fleetq.core.text import escape


def register(commands: Commands) -> None:
    """Add `tokens` and its verbs."""
    parser = commands.add_parser(
        "tokens",
        help="make, list and revoke the HTTP API's bearer tokens",
        description="A token stands for an identity, as a login does: a submitter token "
        "submits as its identity (so the priority class follows it) and cancels only its "
        "own jobs; an operator token cancels any job; a reader token only reads; a runner "
        "token (IDENTITY is a runner id, NODE/NAME) serves that runner through the API "
        "(`fleetq-runner --api URL --token-file F`), as that runner only. The token "
        "is shown once, written to a file of mode 0600; the database keeps its SHA-256 "
        "only. Run these as an administrator.",
    )
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    add = verbs.add_parser(
        "add",
        help="make a token for IDENTITY acting as KIND",
        description="Make a token. `fleetq tokens add submitter ci-bot` writes it to "
        "./ci-bot.token; clients send it as `Authorization: Bearer <token>`.",
    )
    add.add_argument("kind", choices=[k.value for k in tokens.KINDS])
    add.add_argument("identity")
    add.add_argument(
        "--name",
        help="the token's name, to list and revoke it (default: IDENTITY, a runner id's / "
        "written as .)",
    )
    add.add_argument(
        "--token-file",
        type=Path,
        help="where to write the token, mode 0600 (default: ./NAME.token; never "
        "overwritten); `-` prints it instead",
    )
    add_json(add)
    add.set_defaults(func=_add)
    listing = verbs.add_parser("list", help="every token's name and identity (never the token)")
    add_json(listing)
    listing.set_defaults(func=_list)
    revoke = verbs.add_parser("revoke", help="revoke a token: its next request is refused")
    revoke.add_argument("name")
    revoke.set_defaults(func=_revoke)


def _add(args: argparse.Namespace) -> int:
    name = args.name or args.identity.replace("/", ".")  # a runner id: NODE/NAME
    to_stdout = args.token_file == Path("-")
    path = None if to_stdout else (args.token_file or Path(f"{name}.token"))
    with connect(resolve_dsn(args.dsn)) as conn:
        migrate.require_current(conn)
        with conn.transaction():
            made, secret = tokens.add(
                conn, Kind(args.kind), args.identity, name=name, created_by=getpass.getuser()
            )
            if path is not None:
                tokens.write_secret(path, secret)  # fails before the commit: no orphan
    if args.json:
        emit_json(
            {
                "token": made.model_dump(mode="json"),
                "token_file": str(path) if path else None,
                **({"secret": secret} if to_stdout else {}),
            }
        )
        return 0
    if to_stdout:
        print(secret)
        return 0
    print(f"token {made.name}: {made.kind.value} {made.subject}")
    print(f"written to {path} (mode 0600); send it as `Authorization: Bearer <token>`")
    return 0


def _list(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args.dsn)) as conn:
        migrate.require_current(conn)
        found = tokens.tokens(conn)
    if args.json:
        emit_json(found)
        return 0
    print(
        table(
            ["name", "kind", "acts as", "made", "by"],
            [
                [
                    t.name,
                    t.kind,
                    t.subject,
                    t.created_at.isoformat(timespec="seconds"),
                    t.created_by or "",
                ]
                for t in found
            ],
        )
    )
    return 0


def _revoke(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args.dsn)) as conn:
        migrate.require_current(conn)
        revoked = tokens.revoke(conn, args.name)
        conn.commit()
    name = escape(args.name)
    print(f"token {name} revoked" if revoked else f"no token named {name}")
    return Exit.OK if revoked else Exit.DATA
