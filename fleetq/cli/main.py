"""Entry point of the `fleetq` command."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from fleetq import __version__
from fleetq.cli import (
    api,
    bench,
    demo,
    exits,
    jobs,
    logs,
    prune,
    rerun,
    roles,
    runners,
    schedules,
    schema,
    server,
    stats,
    tokens,
    wait,
)
from fleetq.cli.output import terminal
from fleetq.core.errors import ConfigError, FleetqError
from fleetq.core.text import escape


class UsageExit(argparse.ArgumentParser):
    """A parser whose usage errors exit 64 (EX_USAGE), not argparse's 2, which
    `fleetq result` uses for "not decided yet"."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(exits.Exit.USAGE, f"{self.prog}: error: {escape(message)}\n")


class CommandParser(UsageExit):
    """A subcommand's parser: it also takes the options people type after the verb
    (`fleetq migrate --dsn X -v`), the same ones `fleetq` takes before it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # SUPPRESS: given here, it overrides the value before the verb; absent, it
        # leaves that value alone.
        _add_connection_options(self, default=argparse.SUPPRESS)


def _add_connection_options(parser: argparse.ArgumentParser, *, default: Any) -> None:
    parser.add_argument(
        "--dsn",
        default=default if default is argparse.SUPPRESS else None,
        help="PostgreSQL connection string (default: $FLEETQ_DSN, else the embedded server)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default if default is argparse.SUPPRESS else False,
        help="log what happens",
    )


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; each verb lives in its own module."""
    parser = UsageExit(
        prog="fleetq",
        description="fleetq: a fleet job queue on PostgreSQL. With no --dsn and no FLEETQ_DSN, "
        "commands use the embedded PostgreSQL server of this machine (started on first use). "
        "--dsn, -v and --json may stand before or after the command.",
    )
    parser.add_argument("--version", action="version", version=f"fleetq {__version__}")
    _add_connection_options(parser, default=None)
    parser.add_argument(
        "--json",
        dest="json_before_command",
        action="store_true",
        help="machine-readable output, for the commands that list or report",
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=CommandParser
    )
    for module in (
        demo,
        server,
        schema,
        jobs,
        rerun,
        wait,
        logs,
        runners,
        schedules,
        stats,
        prune,
        bench,
        roles,
        tokens,
        api,
    ):
        module.register(commands)
    return parser


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse a command line; `--json` before the command applies to it when it has one."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.json_before_command:
        if not hasattr(args, "json"):
            parser.error(f"`fleetq {_command_name(args)}` has no --json output")
        args.json = True
    return args


def _command_name(args: argparse.Namespace) -> str:
    return " ".join(str(v) for v in (args.command, getattr(args, "verb", None)) if v)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command, writing nothing a terminal acts on (`output.terminal`). An error
    is one line on stderr (its untrusted text escaped) and an exit status from `exits`
    by kind; no traceback reaches a user unless -v asks."""
    with terminal():
        args = parse(argv)
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args))
    except FleetqError as exc:
        # one line, whatever it quotes; a fleet file's problems are one a line
        one_line = not isinstance(exc, ConfigError)
        print(f"fleetq: error: {escape(exc, one_line=one_line)}", file=sys.stderr)
        return exits.for_error(exc)
    except KeyboardInterrupt:
        print(f"fleetq: interrupted{getattr(args, 'interrupted_note', '')}", file=sys.stderr)
        return exits.Exit.INTERRUPTED
    except BrokenPipeError:  # `fleetq jobs | head`: the reader left; that is not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return 0
    except Exception as exc:
        if args.verbose:
            traceback.print_exc()
        print(
            f"fleetq: internal error: {type(exc).__name__}: {escape(exc)} (a bug in fleetq; "
            "-v shows where)",
            file=sys.stderr,
        )
        return exits.Exit.SOFTWARE
