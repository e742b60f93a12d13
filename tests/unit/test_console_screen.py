"""While the console owns the terminal nothing writes over it (issue 15, defect 2): a
handler `fleetq demo` attached to the real stderr before Textual started, asyncpg's
warnings and a worker thread's traceback all went over the screen."""

from __future__ import annotations

import io
import logging
import threading
import warnings
from pathlib import Path

from fleetq.console import screen


def test_logs_warnings_and_thread_failures_go_to_the_file(tmp_path: Path) -> None:
    terminal = io.StringIO()
    root = logging.getLogger()
    before = root.handlers[:]
    handler = logging.StreamHandler(terminal)  # as basicConfig(stream=sys.stderr) leaves it
    root.addHandler(handler)
    try:
        log = tmp_path / "state" / "console.log"
        with screen.owned(log):
            logging.getLogger("asyncpg.pool").warning("connection lost mid-query")
            warnings.warn("resource left open", RuntimeWarning, stacklevel=1)

            def fail() -> None:
                raise RuntimeError("a worker thread died")

            thread = threading.Thread(target=fail, name="stream")
            thread.start()
            thread.join()
        assert terminal.getvalue() == ""
        written = log.read_text()
        assert "connection lost mid-query" in written
        assert "resource left open" in written
        assert "thread stream failed" in written and "RuntimeError" in written
        # and everything is back afterwards
        assert handler in root.handlers and threading.excepthook is not None
        logging.getLogger("fleetq").warning("after")
        assert "after" in terminal.getvalue()
    finally:
        root.handlers = before
