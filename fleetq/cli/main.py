"""Entry point of the `fleetq` command."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from fleetq import __version__
from fleetq.cli import entry, exits
from fleetq.cli.output import terminal
from fleetq.core.errors import ConfigError, FleetqError
from fleetq.core.text import escape

# Each verb and the module of fleetq.cli that adds it, in the order `--help` lists them. A
# command imports only its own module: psycopg, pydantic, FastAPI and Textual take most
# of a second to load, and `fleetq result` in a CI loop paid it all on every call.
# (tests/unit/test_cli_options.py holds this table equal to what the modules add.)
VERBS: dict[str, str] = {
    "demo": "demo",
    "server": "server",
    "migrate": "schema",
    "apply": "schema",
    "config": "schema",
    "submit": "submit",
    "cancel": "jobs",
    "jobs": "jobs",
    "explain": "jobs",
    "events": "jobs",
    "reap": "jobs",
    "result": "result",
    "rerun": "rerun",
    "wait": "wait",
    "logs": "logs",
    "runners": "runners",
    "drain": "runners",
    "pause": "runners",
    "resume": "runners",
    "schedules": "schedules",
    "overlaps": "stats",
    "stats": "stats",
    "prune": "prune",
    "roles": "roles",
    "tokens": "tokens",
    "api": "api",
}
MODULES = tuple(dict.fromkeys(VERBS.values()))
_TAKES_VALUE = ("--dsn",)  # options before the verb that take the next word


def verb_of(argv: Sequence[str]) -> str | None:
    """The verb a command line names, if it names a known one before anything else
    (None: `--help`, no verb, a misspelt one: the whole parser answers those)."""
    words = iter(argv)
    for word in words:
        if word in _TAKES_VALUE:
            next(words, None)
        elif word == "--":
            return None
        elif not word.startswith("-"):
            return word if word in VERBS else None
    return None


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


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The command line: with a known `verb`, only the module that adds it is loaded;
    else the whole of it. Each verb lives in its own module."""
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
    for name in (VERBS[verb],) if verb in VERBS else MODULES:
        module = importlib.import_module(f"fleetq.cli.{name}")
        module.register(commands)
    return parser


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse a command line; `--json` before the command applies to it when it has one."""
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(verb_of(words))
    args = parser.parse_args(words)
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
        try:
            args = parse(argv)  # loads the command's module
        except KeyboardInterrupt:
            print("fleetq: interrupted", file=sys.stderr)
            return exits.Exit.INTERRUPTED
        entry.loaded()
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
