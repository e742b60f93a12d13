"""`fleetq demo`: bring up a working fleet database on this machine with one command.

Until the runner, console and demo issues land, the demo prepares everything they will
stand on: the embedded server, the schema, the example configuration, and prints where
it all is. It is safe to run again (each step is idempotent).
"""

from __future__ import annotations

import argparse

from fleetq.cli.output import table
from fleetq.core import config, migrate
from fleetq.core.db import connect, resolve_dsn, wrap_errors
from fleetq.core.resources import shipped_dir


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `demo`."""
    d = commands.add_parser(
        "demo",
        help="set up a demo fleet on this machine (embedded PostgreSQL, schema, example config)",
        description="Start (or reuse) the embedded PostgreSQL unless --dsn/FLEETQ_DSN names a "
        "server, apply migrations, apply the example fleet configuration and show it.",
    )
    d.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    print("1/3 database: ", end="", flush=True)
    dsn = resolve_dsn(args.dsn)
    print(dsn)
    with wrap_errors():
        applied = migrate.migrate(dsn)
    print(f"2/3 schema: {len(applied)} migration(s) applied, up to date")
    example = shipped_dir("examples") / "fleet.toml"
    with connect(dsn) as conn:
        summary = config.apply(conn, config.load(example), source=example)
        ops = config.operations(conn)
    print(
        f"3/3 config: {example.name} applied ("
        + ", ".join(f"{n} {k}" for k, n in summary.totals.items())
        + ")\n"
    )
    rows = [
        [
            o.project,
            o.name,
            o.lane,
            o.runs,
            ",".join(o.capabilities),
            o.memory_mb,
            f"{o.cpu_millis / 1000:g}",
        ]
        for o in ops
    ]
    print(table(["project", "operation", "lane", "runs", "needs", "memory MB", "cpus"], rows))
    print(
        "\nThe fleet database is ready. Start a runner on this machine with\n"
        "  uv run fleetq-runner --node laptop --lane checks=2 --lane control=1\n"
        "and submit work with `uv run fleetq submit`. The console and the live demo arrive "
        "with their issues;\n`fleetq server status` shows the DSN to connect with psql."
    )
    return 0
