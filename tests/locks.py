"""For race tests that hold one transaction open while another runs into it: wait until
the second is waiting on a lock (or has finished, which a broken lock lets it do)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from fleetq.core.db import connect


def blocked_or_done(dsn: str, pid: int, thread: threading.Thread) -> bool:
    """The session `pid` (run by `thread`) waits on a lock, or the thread has ended."""
    with connect(dsn, autocommit=True) as probe:
        row = probe.execute(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", [pid]
        ).fetchone()
    return not thread.is_alive() or bool(row and row[0])


def wait_for(check: Callable[[], bool], what: str, deadline_s: float = 10.0) -> None:
    """Poll `check` until it holds; fail naming `what` after the deadline."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > deadline_s:
            raise AssertionError(f"{what} not within {deadline_s}s")
        time.sleep(0.01)
