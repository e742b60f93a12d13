"""`fleetq migrate` and `fleetq apply`: the schema and the fleet's configuration."""

from __future__ import annotations

import argparse
from pathlib import Path

from fleetq.cli.output import emit_json, table
from fleetq.core import config, migrate
from fleetq.core.db import connect, resolve_dsn, wrap_errors


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `migrate` and `apply`."""
    m = commands.add_parser(
        "migrate",
        help="apply pending schema migrations",
        description="Apply pending migrations in order, each in its own transaction, under an "
        "advisory lock (safe to run from several machines at once). A second run is a no-op.",
    )
    m.add_argument("--status", action="store_true", help="list applied and pending migrations")
    m.add_argument("--json", action="store_true", help="machine-readable output (with --status)")
    m.set_defaults(func=_migrate)
    a = commands.add_parser(
        "apply",
        help="validate and upsert a fleet configuration file",
        description="Validate FILE.toml (lanes, projects and their operations, identities, "
        "settings) and upsert it in one transaction: a bad file changes nothing. "
        "See examples/fleet.toml.",
    )
    a.add_argument("file", type=Path, metavar="FILE.toml")
    a.add_argument("--check", action="store_true", help="validate only; write nothing")
    a.add_argument("--json", action="store_true", help="machine-readable output")
    a.set_defaults(func=_apply)


def _migrate(args: argparse.Namespace) -> int:
    dsn = resolve_dsn(args.dsn)
    if args.status:
        with wrap_errors():
            rows = migrate.status(dsn)
        if args.json:
            emit_json(rows)
        else:
            print(
                table(
                    ["version", "name", "state", "applied at"],
                    [[f"{r.version:04d}", r.name, r.state, r.applied_at] for r in rows],
                )
            )
        return 0 if all(r.state == migrate.MigrationState.APPLIED for r in rows) else 1
    with wrap_errors():
        applied = migrate.migrate(dsn)
    for m in applied:
        print(f"applied {m.name}")
    print(f"schema up to date ({len(migrate.discover())} migrations)")
    return 0


def _apply(args: argparse.Namespace) -> int:
    loaded = config.load(args.file)
    if args.check:
        print(f"{args.file}: valid")
        return 0
    with connect(resolve_dsn(args.dsn)) as conn:
        migrate.require_current(conn)
        summary = config.apply(conn, loaded, source=args.file)
    if args.json:
        emit_json(summary)
        return 0
    changed = ", ".join(f"{n} {k}" for k, n in summary.changed.items() if n) or "nothing"
    print(f"{args.file}: applied; changed {changed}")
    print("fleet now has " + ", ".join(f"{n} {k}" for k, n in summary.totals.items()))
    return 0
