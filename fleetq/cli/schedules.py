"""`fleetq schedules`: the schedules in force with their next fire times, and pausing
and resuming one (an operator's action, with a reason)."""

from __future__ import annotations

import argparse

from fleetq.cli.common import Commands, actor, add_actor, add_json, run
from fleetq.cli.output import emit_json, table
from fleetq.core import schedules
from fleetq.core.errors import InvalidInput
from fleetq.core.text import escape


def register(commands: Commands) -> None:
    """Add `schedules` (list, pause, resume)."""
    p = commands.add_parser(
        "schedules",
        usage="%(prog)s [-h] [--dsn DSN] [-v] [--json]\n"
        "       %(prog)s pause NAME --reason WHY\n       %(prog)s resume NAME",
        help="list schedules and their next fire times; pause or resume one",
        description="List the schedules of the fleet file ([schedules.NAME]): cron and time "
        "zone, what they submit, the next tick and the last job fired. The runners of a "
        "schedule's lane fire each tick once. `pause NAME --reason WHY` stops a schedule "
        "firing; `resume "
        "NAME` goes on from now (the ticks of the pause are not fired).",
    )
    add_json(p)
    p.set_defaults(func=_do_list)
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    pause = verbs.add_parser("pause", help="stop a schedule firing (a reason is required)")
    pause.add_argument("name", metavar="NAME")
    pause.add_argument("--reason", required=True, help="why (shown to other operators)")
    add_actor(pause)
    pause.set_defaults(func=_do_pause, paused=True)
    resume = verbs.add_parser("resume", help="let a paused schedule fire again, from now")
    resume.add_argument("name", metavar="NAME")
    add_actor(resume)
    resume.set_defaults(func=_do_pause, paused=False, reason="")


def _do_list(args: argparse.Namespace) -> int:
    found = run(args, schedules.listed)
    if args.json:
        emit_json(found)
        return 0
    if not found:
        print("no schedule: add [schedules.NAME] to the fleet file and `fleetq apply` it")
        return 0
    rows = [
        [
            s.name,
            f"{s.cron} ({s.timezone})",
            f"{s.project}/{s.operation}",
            s.commit_sha[:12] if s.commit_sha else f"head of {s.branch}",
            f"{s.next_tick:%Y-%m-%d %H:%M %Z}"
            if s.next_tick
            else f"paused by {s.paused_by}: {s.paused_reason}",
            f"job {s.last_job} ({s.last_fired:%Y-%m-%d %H:%M %Z})" if s.last_job else "-",
            s.catch_up,
        ]
        for s in found
    ]
    print(table(["schedule", "cron", "job", "commit", "next", "last fired", "catch-up"], rows))
    return 0


def _do_pause(args: argparse.Namespace) -> int:
    if args.paused and not args.reason.strip():
        raise InvalidInput("pausing a schedule takes a reason (--reason)")
    run(
        args,
        lambda d: schedules.pause(
            d, name=args.name, paused=args.paused, reason=args.reason, actor=actor(args)
        ),
    )
    print(f"schedule {escape(args.name)} {'paused' if args.paused else 'resumed'}")
    return 0
