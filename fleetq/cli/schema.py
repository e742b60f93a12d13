"""`fleetq migrate` and `fleetq apply`: the schema and the fleet's configuration."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fleetq.cli.common import actor, add_actor, run
from fleetq.cli.exits import Exit
from fleetq.cli.output import emit_json, table
from fleetq.core import config, configview, migrate, migrationfiles, removal, schedules
from fleetq.core.db import connect, resolve_dsn, wrap_errors
from fleetq.core.errors import InvalidInput, NotFound
from fleetq.core.text import escape


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `migrate` and `apply`."""
    m = commands.add_parser(
        "migrate",
        help="apply pending schema migrations",
        description="Apply pending migrations in order, each in its own transaction, under the "
        "migration lock, a table lock only administrators can take (safe to run from several "
        "machines at once: a second run waits, saying for whom, then finds nothing pending).",
    )
    m.add_argument(
        "--status",
        action="store_true",
        help="list applied and pending migrations, each expand or contract (a contract one "
        "stops older fleetq from starting); exit 78 when one is pending, or a contract one "
        "this fleetq does not know is applied, else 0",
    )
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
    a.add_argument(
        "--check",
        action="store_true",
        help="validate the file and check it against the database (unknown lanes), and say "
        "what applying would change; write nothing",
    )
    a.add_argument("--json", action="store_true", help="machine-readable output")
    a.set_defaults(func=_apply)
    c = commands.add_parser(
        "config",
        help="the fleet's configuration as the database has it: show, diff FILE",
        description="`show` prints the configuration the database holds, as a file "
        "`fleetq apply` takes back unchanged; `diff FILE` says what applying FILE would do: "
        "+ new, ~ changed, ! reset to a default because the file leaves the field out, = "
        "kept though the file does not name it (apply never removes).",
    )
    verbs = c.add_subparsers(dest="verb", required=True, metavar="VERB")
    show = verbs.add_parser("show", help="the configuration, as a fleet file (or --json)")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.set_defaults(func=_config_show)
    d = verbs.add_parser("diff", help="what applying FILE would change")
    d.add_argument("file", type=Path, metavar="FILE.toml")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.set_defaults(func=_config_diff)
    r = verbs.add_parser(
        "remove",
        help="remove an operation (refused while it has live jobs) or a schedule; their "
        "history stays",
        description="Remove operation PROJECT/OPERATION: submits are refused from then on; "
        "its jobs and results stay. Refused (exit status 75) while it has queued, claimed or "
        "running jobs. `fleetq apply` with the operation in the file brings it back. Remove "
        "schedule NAME: it fires no more; the jobs it fired stay.",
    )
    r.add_argument("what", choices=["operation", "schedule"], help="what to remove")
    r.add_argument("name", metavar="PROJECT/OPERATION|NAME")
    add_actor(r)
    r.set_defaults(func=_config_remove)


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
                    ["version", "name", "kind", "state", "applied at"],
                    [
                        [f"{r.version:04d}", r.name, _kind(r.contract), r.state, r.applied_at]
                        for r in rows
                    ],
                )
            )
        # 78, as every command says when the schema stops it: something to apply, or a
        # contract migration this code does not know (a newer fleetq's)
        stopped = any(
            r.state == migrate.MigrationState.PENDING
            or (r.state == migrate.MigrationState.UNKNOWN and r.contract)
            for r in rows
        )
        return Exit.CONFIG if stopped else Exit.OK
    with wrap_errors():
        protocol: list[str] = []
        applied = migrate.migrate(dsn, on_protocol=protocol.append, on_wait=_say_waiting)
    for m in applied:
        print(f"applied {m.name}")
    for name in protocol:
        print(f"re-applied {name}")
    print(f"schema up to date ({len(migrationfiles.discover())} migrations)")
    return 0


def _say_waiting(message: str) -> None:
    """A migrate waiting for another says so, on stderr: stdout lists what it applied."""
    print(message, file=sys.stderr, flush=True)


def _kind(contract: bool) -> str:
    """A contract migration stops older fleetq from starting; an expand one does not."""
    return "contract" if contract else "expand"


def _apply(args: argparse.Namespace) -> int:
    loaded = config.load(args.file)
    with connect(resolve_dsn(args.dsn)) as conn:
        migrate.require_current(conn)
        changes = configview.diff(configview.current(conn), loaded)
        if args.check:
            config.check(conn, loaded, source=args.file)
            print(f"{args.file}: valid; applying it would change:")
            _print_changes(changes)
            return 0
        for c in changes:
            if c.kind == configview.ChangeKind.RESET:
                print(f"warning: {escape(c.describe())}", file=sys.stderr)
        summary = config.apply(conn, loaded, source=args.file)
    if args.json:
        emit_json(summary)
        return 0
    changed = ", ".join(f"{n} {k}" for k, n in summary.changed.items() if n) or "nothing"
    print(f"{args.file}: applied; changed {changed}")
    print("fleet now has " + ", ".join(f"{n} {k}" for k, n in summary.totals.items()))
    return 0


def _config_show(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args.dsn)) as conn:
        migrate.require_current(conn)
        now = configview.current(conn)
    if args.json:
        emit_json(now)
    else:
        sys.stdout.write(configview.to_toml(now))
    return 0


def _config_diff(args: argparse.Namespace) -> int:
    loaded = config.load(args.file)
    with connect(resolve_dsn(args.dsn)) as conn:
        migrate.require_current(conn)
        changes = configview.diff(configview.current(conn), loaded)
    if args.json:
        emit_json(changes)
    else:
        _print_changes(changes)
    return 0


def _config_remove(args: argparse.Namespace) -> int:
    if args.what == "schedule":
        if not run(args, lambda d: schedules.remove(d, name=args.name, actor=actor(args))):
            raise NotFound(f"no schedule {escape(args.name)}")
        print(f"schedule {escape(args.name)} removed; the jobs it fired stay")
        return 0
    project, slash, operation = args.name.partition("/")
    if not (project and slash and operation):
        raise InvalidInput(f"expected PROJECT/OPERATION, got {escape(args.name)}")
    done = run(
        args,
        lambda d: removal.remove_operation(
            d, project=project, operation=operation, actor=actor(args)
        ),
    )
    name = escape(f"{project}/{operation}")
    if not done.removed:
        print(f"operation {name} was already removed (at {done.retired_at:%Y-%m-%d %H:%M:%S %Z})")
    else:
        print(f"operation {name} removed; its {done.jobs} job(s) and their results stay")
    return 0


def _print_changes(changes: list[configview.Change]) -> None:
    doing = [c for c in changes if c.kind != configview.ChangeKind.KEEP]
    for c in changes:
        print(escape(c.describe()))
    if not doing:
        print("(nothing would change)")
