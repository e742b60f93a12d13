"""The `fleetq` command's entry point, importing nothing heavy itself.

Why: the command's modules (psycopg, pydantic, FastAPI, Textual pieces) take most of a
second to load. A Ctrl-C in that time raised KeyboardInterrupt outside every handler,
so a traceback was printed instead of the 130 every command exits with on Ctrl-C; and
`fleetq --version` paid that second for one line.
"""

from __future__ import annotations

import sys

from fleetq import __version__

INTERRUPTED = 130  # as fleetq.cli.exits.Exit.INTERRUPTED, without importing it
CONFIG = 78  # as fleetq.cli.exits.Exit.CONFIG: an extra is missing


def console() -> int:
    """`fleetq-console`: the console, or one line saying which extra it needs (its
    modules import Textual as they load)."""
    from fleetq.core import extras
    from fleetq.core.errors import ExtraMissing

    if not extras.installed("console"):
        missing = ExtraMissing("fleetq-console", "console")
        print(f"fleetq-console: error: {missing}", file=sys.stderr)
        return CONFIG
    from fleetq.console.main import main as run

    return run()


def main() -> int:
    """Answer `--version` at once; else load the command line and run it."""
    if sys.argv[1:] == ["--version"]:
        print(f"fleetq {__version__}")
        return 0
    try:
        from fleetq.cli.main import main as run
    except KeyboardInterrupt:
        return INTERRUPTED
    return run()
