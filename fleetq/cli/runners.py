"""Runner commands: runners (and runners forget), drain, pause, resume."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from fleetq.cli.common import Commands, actor, add_actor, add_json, age, run
from fleetq.cli.output import emit_json, table
from fleetq.core import fleet, removal
from fleetq.core.models import RunnerState
from fleetq.core.text import escape

_VERBS = {
    "drain": (RunnerState.DRAINING, "stop claiming; finish what it runs, then show drained"),
    "pause": (RunnerState.PAUSED, "stop claiming for now; running jobs continue"),
    "resume": (RunnerState.ACTIVE, "claim work again"),
}


def register(commands: Commands) -> None:
    """Add the runner commands."""
    p = commands.add_parser(
        "runners",
        usage="%(prog)s [-h] [--dsn DSN] [-v] [--json]\n       %(prog)s forget RUNNER",
        help="list runners with lanes, capacity and state; `runners forget RUNNER`",
        description="List the fleet's runners. `runners forget RUNNER` removes a runner that "
        "is gone for good from the listings, capacity and eligibility; its history stays, and "
        "it is back as soon as it is heard from again.",
    )
    add_json(p)
    p.set_defaults(func=_do_list)
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    f = verbs.add_parser(
        "forget",
        help="forget an offline runner that holds nothing (its history stays)",
        description="Forget RUNNER (node/name): it must be offline (stopped, or silent past "
        "the offline threshold) and hold no job; its leases are the reaper's to recover "
        "first. Refused otherwise, with exit status 75 (try again later).",
    )
    f.add_argument("runner", metavar="RUNNER")
    add_actor(f)
    f.set_defaults(func=_do_forget)
    for verb, (_, effect) in _VERBS.items():
        v = commands.add_parser(
            verb,
            help=f"{verb} a runner: {effect}",
            description=f"{verb.capitalize()} RUNNER (node/name): {effect}. "
            "The runner observes it through the database.",
        )
        v.add_argument("runner", metavar="RUNNER")
        v.add_argument("--reason", default="", help="why (shown to other operators)")
        add_actor(v)
        v.set_defaults(func=_do_state, verb=verb)


def _do_list(args: argparse.Namespace) -> int:
    found = run(args, fleet.runners)
    if args.json:
        emit_json(found)
        return 0
    now = datetime.now(UTC)
    rows = [
        [
            r.id,
            "offline" if r.offline and r.state != RunnerState.OFFLINE else r.state,
            " ".join(f"{lane}:{used}/{slots}" for lane, (slots, used) in sorted(r.lanes.items())),
            ",".join(r.capabilities),
            f"{r.reserved_memory_mb}/{r.memory_mb}",
            f"{r.reserved_cpu_millis / 1000:g}/{r.cpu_millis / 1000:g}",
            age(r.last_heartbeat_at, now),
            r.stale_rejections,
            r.state_reason or "",
        ]
        for r in found
    ]
    print(
        table(
            [
                "runner",
                "state",
                "lanes used/slots",
                "capabilities",
                "memory MB",
                "cpus",
                "heartbeat",
                "stale",
                "reason",
            ],
            rows,
        )
    )
    return 0


def _do_forget(args: argparse.Namespace) -> int:
    at = run(args, lambda d: removal.forget_runner(d, runner=args.runner, actor=actor(args)))
    since = f"{at:%Y-%m-%d %H:%M:%S %Z}"
    print(f"runner {escape(args.runner)} forgotten (since {since}); its history stays")
    return 0


def _do_state(args: argparse.Namespace) -> int:
    state, _ = _VERBS[args.verb]
    written = run(
        args,
        lambda d: fleet.set_state(
            d, runner=args.runner, state=state, reason=args.reason, actor=actor(args)
        ),
    )
    print(f"runner {escape(args.runner)} is now {written}")
    return 0
