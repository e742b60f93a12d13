"""Entry point of the `fleetq` command."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from fleetq import __version__
from fleetq.cli import bench, demo, jobs, runners, schema, server, stats
from fleetq.core.errors import FleetqError


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; each verb lives in its own module."""
    parser = argparse.ArgumentParser(
        prog="fleetq",
        description="fleetq: a fleet job queue on PostgreSQL. With no --dsn and no FLEETQ_DSN, "
        "commands use the embedded PostgreSQL server of this machine (started on first use).",
    )
    parser.add_argument("--version", action="version", version=f"fleetq {__version__}")
    parser.add_argument(
        "--dsn",
        help="PostgreSQL connection string (default: $FLEETQ_DSN, else the embedded server)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (demo, server, schema, jobs, runners, stats, bench):
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; fleetq errors become one line on stderr and exit status 1."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args))
    except FleetqError as exc:
        print(f"fleetq: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `fleetq jobs | head`: the reader left; that is not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return 0
