"""Entry point of `fleetq-console`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from fleetq import __version__
from fleetq.console import screen
from fleetq.console.app import ConsoleApp
from fleetq.console.commands import VIEWS
from fleetq.core.db import resolve_dsn
from fleetq.core.errors import FleetqError
from fleetq.core.models import JobId


def build_parser() -> argparse.ArgumentParser:
    """`fleetq-console [--dsn DSN] [--readonly] [--as NAME] [--view V] [--job N]`."""
    parser = argparse.ArgumentParser(
        prog="fleetq-console",
        description="The operator's live view of a fleetq fleet: lanes, jobs and why they "
        "wait, lease timelines and overlap windows, runners, events; cancel jobs and drain, "
        "pause or resume runners from the keyboard (each asks first). With no --dsn and no "
        "FLEETQ_DSN it uses this machine's embedded PostgreSQL. Press ? inside for the keys.",
    )
    parser.add_argument("--version", action="version", version=f"fleetq-console {__version__}")
    parser.add_argument(
        "--dsn", help="PostgreSQL connection string (default: $FLEETQ_DSN, else embedded)"
    )
    parser.add_argument(
        "--readonly", action="store_true", help="watch only: every action is hidden and refused"
    )
    parser.add_argument(
        "--as",
        dest="actor",
        metavar="NAME",
        help="who acts, recorded with each action (default: $FLEETQ_ACTOR, else your login)",
    )
    parser.add_argument("--view", choices=VIEWS, default="overview", help="the view to open on")
    parser.add_argument("--job", type=int, metavar="ID", help="open on this job's detail view")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the console until the operator quits."""
    args = build_parser().parse_args(argv)
    try:
        dsn = resolve_dsn(args.dsn)
    except FleetqError as exc:
        print(f"fleetq-console: error: {exc}", file=sys.stderr)
        return 1
    app = ConsoleApp(
        dsn,
        readonly=args.readonly,
        actor=args.actor or os.environ.get("FLEETQ_ACTOR"),
        job=JobId(args.job) if args.job is not None else None,
        view="detail" if args.job is not None else args.view,
    )
    with screen.owned(screen.default_log()):
        app.run()
    return app.return_code or 0


if __name__ == "__main__":
    sys.exit(main())


def run_console(
    dsn: str, *, readonly: bool = False, title: str | None = None, log: Path | None = None
) -> None:
    """Run the console on `dsn` until the operator quits (blocks). Meanwhile log records,
    warnings and thread exceptions go to `log` (default `screen.default_log()`), never
    over the screen."""
    with screen.owned(log or screen.default_log()):
        ConsoleApp(dsn, readonly=readonly, title=title).run()
