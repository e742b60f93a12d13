"""`fleetq overlaps` and `fleetq stats`."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from fleetq.cli.common import Commands, add_json, run
from fleetq.cli.output import emit_json, table
from fleetq.core import stats


def register(commands: Commands) -> None:
    """Add `overlaps` and `stats`."""
    o = commands.add_parser(
        "overlaps",
        help="windows where two executions of one job ran at once",
        description="Overlap windows from the executions table: which tokens, which runners, "
        "from when to when, and whether the end was confirmed (the process group was seen "
        "gone, or the run ended with an outcome). An end is 'measured' when a runner that "
        "watched the process dated its exit as it happened. Otherwise the older run's end "
        "was not seen (its runner was killed, frozen or cut off) and is known only to lie "
        "before it was recorded: the window is possible, at most that long (shown with ≤), "
        "and may never have happened.",
    )
    o.add_argument("--open", action="store_true", help="only windows still open")
    add_json(o)
    o.set_defaults(func=_do_overlaps)
    s = commands.add_parser("stats", help="queue wait, duplicate executions, recovery delay")
    s.add_argument("--project", help="only this project's jobs")
    add_json(s)
    s.set_defaults(func=_do_stats)


def _do_overlaps(args: argparse.Namespace) -> int:
    found = run(args, lambda d: stats.overlaps(d, open_only=args.open))
    if args.json:
        emit_json(found)
        return 0
    now = datetime.now(UTC)
    print(
        table(
            ["job", "tokens", "runners", "from", "to", "seconds", "end"],
            [
                [
                    o.job_id,
                    f"{o.older_token}/{o.newer_token}",
                    f"{o.older_runner} / {o.newer_runner}",
                    o.started_at.astimezone().strftime("%H:%M:%S.%f")[:-3],
                    o.ended_at.astimezone().strftime("%H:%M:%S.%f")[:-3] if o.ended_at else "open",
                    ("" if o.open or o.end_measured else "≤") + f"{o.seconds(now):.3f}",
                    _end(o),
                ]
                for o in found
            ],
        )
    )
    return 0


def _end(o: stats.Overlap) -> str:
    if o.open:
        return "open"
    confirmed = "confirmed" if o.end_confirmed else "unconfirmed"
    if o.end_measured:
        return f"{confirmed}, measured"
    return f"{confirmed}; possible, at most this long ({o.unseen()})"


def _do_stats(args: argparse.Namespace) -> int:
    figures = run(args, lambda d: stats.stats(d, project=args.project))
    if args.json:
        emit_json(figures)
        return 0
    print("jobs: " + ", ".join(f"{n} {s}" for s, n in sorted(figures.states.items())))
    print(
        f"duplicate-execution incidents: {figures.duplicate_execution_incidents} "
        f"({figures.open_overlaps} still open)"
        + (
            f"; {figures.possible_overlaps} more possible (an end not seen: at most)"
            if figures.possible_overlaps
            else ""
        )
    )
    r = figures.recovery
    delay = f"p50 {r.p50_s:.3f}s, max {r.max_s:.3f}s" if r.p50_s is not None else "none yet"
    print(f"expiries and losses: {r.incidents}, claimed again: {r.recovered} ({delay})")
    print(
        f"zombie writes refused: {figures.stale_rejections} "
        f"(and {figures.self_races} races with a runner's own outcome, benign)"
    )
    if figures.flaky:
        print("\nflaky tests (failed, then passed at the same commit):")
        print(
            table(
                ["project", "operation", "test", "commits", "last passed"],
                [
                    [f.project, f.operation, f.test, f.commits, f"{f.last_passed_at:%F %H:%M}"]
                    for f in figures.flaky
                ],
            )
        )
    if figures.queue_wait:
        print("\nqueue wait (created -> claimed):")
        print(
            table(
                ["class", "project", "jobs", "p50 s", "p95 s", "max s"],
                [
                    [
                        w.priority_class,
                        w.project,
                        w.jobs,
                        f"{w.p50_s:.3f}",
                        f"{w.p95_s:.3f}",
                        f"{w.max_s:.3f}",
                    ]
                    for w in figures.queue_wait
                ],
            )
        )
    return 0
