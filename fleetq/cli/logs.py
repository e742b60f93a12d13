"""`fleetq logs JOB [--follow] [--token N]`: a job's output from the database, from any
machine; with --follow, new output as it arrives (woken by NOTIFY) until the job ends."""

from __future__ import annotations

import argparse
import sys

from fleetq.cli import wait
from fleetq.cli.common import Commands, job_id_arg, token_arg
from fleetq.cli.exits import DECISION_EXIT
from fleetq.core import migrate, output, queries
from fleetq.core.db import SyncConnection, connect, resolve_dsn
from fleetq.core.errors import NotFound
from fleetq.core.models import JobId, JobState, decision
from fleetq.core.text import escape

FOLLOW_POLL_S = 1.0  # a NOTIFY wakes a follower at once; this bounds a missed one


def register(commands: Commands) -> None:
    """Add `logs`."""
    p = commands.add_parser(
        "logs",
        help="a job's output, from any machine (--follow: as it runs)",
        description="A command job's output as its runner shipped it to the database (every "
        "half second while it runs, the rest before its outcome). Runs under several tokens "
        "are shown in order, each under a header on stderr. Each run keeps its first 64 KiB "
        "and its newest output_keep_kib (a setting, default 1024); a line on stderr says how "
        "many bytes were dropped between them (the log on the runner's node has all). "
        "Control characters are shown escaped (\\x1b...), never sent to your terminal raw.",
    )
    p.add_argument("job_id", type=job_id_arg, metavar="JOB")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    p.add_argument("--token", type=token_arg, metavar="N", help="only the run under token N")
    p.add_argument(
        "--exit-status",
        action="store_true",
        help="exit with the job's verdict, as `fleetq wait` does (0 passed, 1 failed, 3 could "
        "not run, 2 not decided): with --follow, a CI gate that shows the output too",
    )
    p.set_defaults(func=_do_logs)


def _do_logs(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args.dsn), autocommit=True) as conn:
        migrate.require_current(conn)
        if _state(conn, args.job_id) is None:
            raise NotFound(f"no job {args.job_id}")
        if args.token is not None and not _ran_under(conn, args.job_id, args.token):
            raise NotFound(f"job {args.job_id} never ran under token {args.token}")
        if args.follow:
            conn.execute(b"LISTEN fleetq_output")
        printer = _Printer()
        while True:
            printer.show(_read(conn, args.job_id, args.token, printer.after))
            if not args.follow:
                return _status(conn, args)
            state = _state(conn, args.job_id)
            if state is not None and state.terminal:
                # its output was shipped before its outcome: one more read has all of it
                printer.show(_read(conn, args.job_id, args.token, printer.after))
                return _status(conn, args)
            for _ in conn.notifies(timeout=FOLLOW_POLL_S, stop_after=1):
                pass


def _status(conn: SyncConnection, args: argparse.Namespace) -> int:
    """0, or with --exit-status the job's verdict as `fleetq wait` exits with it."""
    if not args.exit_status:
        return 0
    (answer,) = wait.wait_and_judge(conn, [JobId(args.job_id)], timeout_s=0)
    print(wait.describe(answer), file=sys.stderr)
    return DECISION_EXIT[decision([answer])]


class _Printer:
    """Prints chunks as they are read, a header when a run begins and a marker (on
    stderr) where its stored output lost bytes."""

    def __init__(self) -> None:
        self.after = (0, -1)
        self.end: int | None = None  # where the last chunk printed ends in its run

    def show(self, rows: list[tuple[int, int, int | None, bytes]]) -> None:
        for token, seq, start, data in rows:
            if token != self.after[0]:
                print(f"── run under token {token} ──", file=sys.stderr, flush=True)
                self.end = None
                if start is None and seq > 0:  # an older runner's chunk: no offsets
                    _note("── earlier output dropped (only the newest output_keep_kib are kept) ──")
            if (missing := output.gap(self.end, start)) > 0:
                _note(output.dropped_marker(missing))
            text = data.decode("utf-8", errors="replace").replace("\r\n", "\n")
            sys.stdout.write(escape(text, one_line=False))
            sys.stdout.flush()
            self.after = (token, seq)
            self.end = None if start is None else start + len(data)


def _note(line: str) -> None:
    sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)


def _read(
    conn: SyncConnection, job: int, token: int | None, after: tuple[int, int]
) -> list[tuple[int, int, int | None, bytes]]:
    rows = conn.execute(
        queries.sql("output_read").encode(), [job, token, after[0], after[1]]
    ).fetchall()
    return [(int(r[0]), int(r[1]), None if r[4] is None else int(r[4]), bytes(r[3])) for r in rows]


def _state(conn: SyncConnection, job: int) -> JobState | None:
    cursor = conn.execute(queries.sql("jobs_get").encode(), [job])
    row = cursor.fetchone()
    if row is None:
        return None
    columns = [c.name for c in cursor.description or []]
    return JobState(row[columns.index("state")])


def _ran_under(conn: SyncConnection, job: int, token: int) -> bool:
    """Whether `token` was ever granted for `job` (a claim's event names it)."""
    row = conn.execute(queries.sql("output_token_granted").encode(), [job, token]).fetchone()
    return bool(row and row[0])
