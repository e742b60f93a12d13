"""While the console owns the terminal, nothing else may write to it.

Why: `fleetq demo` configures logging to stderr before Textual starts, so its handler
holds the real stderr, which Textual's own capture of `sys.stderr` never sees. During a
database outage asyncpg's warnings, a worker thread's traceback or a runner-side log line
were then written over the screen, and their rows stayed until the next repaint. Here
every log record, every warning and every uncaught thread exception goes to a file
instead, and everything is put back when the console exits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from textual.filter import LineFilter, Monochrome, NoColor

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def default_log() -> Path:
    """`$XDG_STATE_HOME/fleetq/console.log` (default `~/.local/state/fleetq/console.log`)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "fleetq" / "console.log"


@contextlib.contextmanager
def owned(log: Path) -> Iterator[None]:
    """Send logs, warnings and thread exceptions to `log` for the duration."""
    log.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    to_file = logging.FileHandler(log, encoding="utf-8")
    to_file.setFormatter(logging.Formatter(FORMAT))
    root.handlers = [to_file]
    root.setLevel(min(level, logging.INFO) if level else logging.INFO)
    logging.captureWarnings(True)
    hook = threading.excepthook

    def thread_failed(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit or args.exc_value is None:
            return
        name = args.thread.name if args.thread is not None else "?"
        logging.getLogger("fleetq.console").error(
            "thread %s failed", name, exc_info=(args.exc_type, args.exc_value, args.exc_traceback)
        )

    threading.excepthook = thread_failed
    try:
        yield
    finally:
        threading.excepthook = hook
        logging.captureWarnings(False)
        root.handlers = handlers
        root.setLevel(level)
        to_file.close()


def without_colour(filters: list[LineFilter]) -> list[LineFilter]:
    """Under NO_COLOR, Textual maps each colour to its grey (Monochrome): the red alerts
    came out 237 on 233, unreadable. The terminal's own colours (NoColor) keep all text
    readable; bold, reverse and the ▲ marks still set alerts apart."""
    return [f for f in filters if not isinstance(f, Monochrome)] + [NoColor()]
