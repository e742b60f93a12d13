"""The `fleetq` command's entry point, importing nothing heavy itself.

Why: the command's modules (psycopg, pydantic, FastAPI, Textual pieces) take most of a
second to load. A Ctrl-C in that time raised KeyboardInterrupt outside every handler,
so a traceback was printed instead of the 130 every command exits with on Ctrl-C; and
`fleetq --version` paid that second for one line.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

from fleetq import __version__

INTERRUPTED = 130  # as fleetq.cli.exits.Exit.INTERRUPTED, without importing it
CONFIG = 78  # as fleetq.cli.exits.Exit.CONFIG: an extra is missing


def _interrupted_while_loading(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C while modules load: exit 130 at once. A KeyboardInterrupt raised inside an
    import can surface as another error (a RuntimeError from `__set_name__`) or as
    "Exception ignored" with a traceback from importlib's own callbacks, and an import
    has nothing to undo."""
    os.write(2, f"{_command}: interrupted\n".encode())
    os._exit(INTERRUPTED)


_command = "fleetq"


def loading(command: str = "fleetq") -> None:
    """Until `loaded()`, a Ctrl-C ends the process at once with 130."""
    global _command
    _command = command
    signal.signal(signal.SIGINT, _interrupted_while_loading)


def loaded() -> None:
    """The command's modules are in: Ctrl-C raises KeyboardInterrupt again, which the
    command handles. A no-op where `loading()` was not called (in-process callers)."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_loading:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def console() -> int:
    """`fleetq-console`: the console, or one line saying which extra it needs (its
    modules import Textual as they load)."""
    loading("fleetq-console")
    from fleetq.core import extras
    from fleetq.core.errors import ExtraMissing

    if not extras.installed("console"):
        missing = ExtraMissing("fleetq-console", "console")
        print(f"fleetq-console: error: {missing}", file=sys.stderr)
        return CONFIG
    from fleetq.console.main import main as run

    loaded()
    return run()


def main() -> int:
    """Answer `--version` at once; else load the command line and run it."""
    if sys.argv[1:] == ["--version"]:
        print(f"fleetq {__version__}")
        return 0
    loading()
    from fleetq.cli.main import main as run  # loaded() once it has parsed the command line

    return run()
