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
