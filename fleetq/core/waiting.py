"""Waiting for jobs to end, woken by the database (`fleetq wait`, `result --wait`, `logs
--follow --exit-status`): a CI gate blocks on its check instead of polling.

How: LISTEN on `fleetq_done` first, then name the jobs (`fleetq.watch_jobs`, which answers
their states now), so no ending falls between the two; an ending of a watched job
notifies (migration 0034). A notification is a hint: the states are read again. A read
every `RESYNC_S` is the safety net for one missed while the connection was away, never
the way an ending is learnt.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from fleetq.core import queries
from fleetq.core.db import SyncConnection
from fleetq.core.errors import NotFound
from fleetq.core.models import JobId, JobState

RESYNC_S = 30.0


def wait_for(
    conn: SyncConnection, jobs: Sequence[JobId], *, timeout_s: float | None = None
) -> dict[JobId, JobState]:
    """Block until every job in `jobs` has ended, or `timeout_s` passes; return each job's
    state when it returned (some not terminal after a timeout). `conn` is in autocommit
    mode. An id the database does not know is NotFound, at once; more than the database
    watches at once (1,000) is refused by it."""
    wanted = list(dict.fromkeys(jobs))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    conn.execute(b"LISTEN fleetq_done")
    try:
        states = _watch(conn, wanted)
        if missing := [j for j in wanted if j not in states]:
            raise NotFound(f"no job {', '.join(map(str, missing))}")
        while not all(s.terminal for s in states.values()):
            left = RESYNC_S if deadline is None else min(RESYNC_S, deadline - time.monotonic())
            if left <= 0:
                break
            for _ in conn.notifies(timeout=left, stop_after=1):
                pass
            states = _states(conn, wanted)
        return states
    finally:
        conn.execute(queries.sql("watch_jobs").encode(), [[]])  # watch nothing any more
        conn.execute(b"UNLISTEN fleetq_done")


def _watch(conn: SyncConnection, jobs: list[JobId]) -> dict[JobId, JobState]:
    rows = conn.execute(queries.sql("watch_jobs").encode(), [jobs]).fetchall()
    return {JobId(int(r[0])): JobState(r[1]) for r in rows}


def _states(conn: SyncConnection, jobs: list[JobId]) -> dict[JobId, JobState]:
    rows = conn.execute(queries.sql("watch_states").encode(), [jobs]).fetchall()
    return {JobId(int(r[0])): JobState(r[1]) for r in rows}
