"""`fleetq demo`: the whole fleet on one machine, with one command (issue #7).

The verb only parses; `fleetq.demo.session` runs the demo.
"""

from __future__ import annotations

import argparse
import sys

from fleetq.cli.common import Commands
from fleetq.core import extras

DESCRIPTION = """\
Show what fleetq is for, in about a minute, on this machine alone:

  1. start (or reuse) the embedded PostgreSQL unless --dsn/FLEETQ_DSN names a server;
     on it, create (or reuse) the demo's own database, named after the one the DSN
     names with `_demo` added (`fleetq_demo` on the embedded server), migrate it and
     apply the demo configuration there: lanes `checks` and `control`, two
     projects on local git repositories the demo builds (`webapp`, a release gate, and
     `tools`), with real checks: quick unit tests, a slow integration suite, a browser
     check, a lint that fails and a staging test that runs into its 2 s timeout;
  2. start three fleetq-runner processes: node-a (no browser), node-b (browser, little
     room) and node-c (browser and room);
  3. submit a stream of jobs from four identities, some repeated with the same
     idempotency key; a third of the way in, SIGSTOP the runner running a slow check
     until its lease expires and another runner takes the job over (an overlap window),
     then SIGCONT it (it stops its superseded run); then cancel a running job;
  4. open fleetq-console on it (when stdout is a terminal and not --headless); when the
     console quits or the stream ends headless, let the queue settle, drain and stop
     the runners, and print the report.

The report gives jobs by outcome, queue wait by project and priority class, prepare vs
run time, completed jobs per interval, recovery delay, overlap windows with their
confirmed ends, and stale-lease rejections. Exit status 1 if an accepted job was lost
or never settled, a fenced-ledger write went behind a newer token, or a runner had to
be killed; otherwise 0 (a fault that produced no overlap is a warning); 130 after
Ctrl-C; 75 when another demo is running in the same demo database.

The database the DSN names is never written to: your own fleet's settings, runners and
jobs stay as they are, and its runners never see the demo's jobs. One demo at a time
runs in a demo database (a lock only the demo's own login can take, in that database).

Files: $FLEETQ_HOME/demo/ with the embedded server (kept between runs), else a
temporary directory. Running it again reuses the demo's database; the report covers
that run's jobs only. Ctrl-C once ends the stream early, twice stops waiting for the
queue.
"""


def register(commands: Commands) -> None:
    """Add `demo`."""
    d = commands.add_parser(
        "demo",
        help="a whole fleet on this machine: runners, a job stream, a fault, a report",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument(
        "--headless",
        action="store_true",
        help="no console: print progress and the report (the default when stdout is not a "
        "terminal)",
    )
    d.add_argument(
        "--duration",
        type=_positive,
        default=60.0,
        metavar="SECONDS",
        help="how long the job stream runs (default 60; the fault and the cancel scale "
        "with it; 20 is about the shortest that tells the whole story)",
    )
    d.add_argument(
        "--lease",
        type=int,
        default=3,
        choices=range(3, 31),
        metavar="SECONDS",
        help="lease length for the demo's jobs (default 3, so a frozen runner loses its "
        "jobs quickly)",
    )
    d.add_argument(
        "--reset",
        action="store_true",
        help="start over: drop every fleetq table in the demo's own database (its jobs, "
        "runners, events; never the database --dsn names) and the demo's runner "
        "directories, then migrate again",
    )
    d.set_defaults(func=_demo)


def _positive(value: str) -> float:
    seconds = float(value)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return seconds


def _demo(args: argparse.Namespace) -> int:
    if not args.headless and sys.stdout.isatty():  # as the session decides to open it
        extras.require("console", "fleetq demo's console", otherwise="or run it --headless")
    from fleetq.demo import session  # the demo's modules load only for this verb

    return session.main(
        session.Options(
            dsn=args.dsn,
            duration_s=args.duration,
            lease_s=args.lease,
            headless=args.headless,
            reset=args.reset,
        )
    )
