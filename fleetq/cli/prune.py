"""`fleetq prune --before DATE`: remove the history of jobs that ended before DATE, in
batches, each its own transaction (the rules: fleetq/core/prune.py)."""

from __future__ import annotations

import argparse
import sys

from fleetq.cli.common import Commands, add_json, positive_arg, run
from fleetq.cli.output import emit_json
from fleetq.core import prune
from fleetq.core.errors import InvalidInput

_DESCRIPTION = """\
Remove the history of jobs that ended before DATE: each such job with every row that
names it (executions, events, verdict, output, dependency edges, task notifications,
schedule ticks), then the events tied to no job that are older than DATE. Jobs that have
not ended never go, nor do jobs still settling (a cancelled job whose runner has not
confirmed the stop, a run whose end is not reported yet, anything recorded since DATE),
jobs that a job which stays depends on, and jobs another transaction holds at that
moment (a later prune takes them). The newest event always stays.

A pruned job is gone for good: `fleetq result` no longer knows its verdict, `submit
--after` cannot name it, and its idempotency key is free again.

Works in batches of --batch jobs (then events) per transaction, so it never holds a long
transaction nor waits on a row a runner holds; each batch is reported on stderr as it
commits, and an interrupted prune can simply be run again. Only an administrator (a
superuser or a member of fleetq_owner) may prune."""

_EPILOG = """\
examples:
  fleetq prune --before 30d --dry-run     what would go (counted, nothing deleted)
  fleetq prune --before 30d               history that ended over 30 days ago
  fleetq prune --before 2024-05-01 --batch 1000 --json"""


def register(commands: Commands) -> None:
    """Add `prune`."""
    p = commands.add_parser(
        "prune",
        help="remove the history of jobs that ended before DATE (administrators)",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--before",
        required=True,
        metavar="DATE",
        type=_before,
        help="an ISO date or timestamp (2024-05-01, 2024-05-01T12:00Z; no zone: local "
        "time) or an age back from the database's clock (30d, 12h, 90m, 45s, 2w); "
        "must be in the past",
    )
    p.add_argument(
        "--batch",
        type=positive_arg,
        default=prune.BATCH,
        metavar="N",
        help=f"jobs (then events) read per transaction (default {prune.BATCH})",
    )
    p.add_argument("--dry-run", action="store_true", help="count what would go; delete nothing")
    add_json(p)
    p.set_defaults(func=_do_prune)


def _before(text: str) -> object:
    try:
        return prune.parse_before(text)
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _do_prune(args: argparse.Namespace) -> int:
    args.interrupted_note = (
        ": every batch reported above is committed; the same command goes on from there"
    )
    summary = run(
        args,
        lambda d: prune.prune(
            d, before=args.before, batch=args.batch, dry_run=args.dry_run, progress=_report
        ),
    )
    if args.json:
        emit_json(summary)
        return 0
    print(_summary(summary))
    return 0


def _report(batch: prune.Batch) -> None:
    r, k = batch.removed, batch.kept
    span = (
        f"ids {batch.first_id}-{batch.last_id}" if batch.last_id >= batch.first_id else "none left"
    )
    what = f"{r.jobs:,} jobs ({r.rows:,} rows)" if batch.phase == "jobs" else f"{r.events:,} events"
    kept = f", kept {k.total:,}" if k.total else ""
    print(
        f"{batch.phase} batch {batch.number}: {span}: {what}{kept}; {batch.seconds:.2f}s",
        file=sys.stderr,
        flush=True,
    )


def _summary(s: prune.Summary) -> str:
    r, k = s.removed, s.kept
    lines = [
        f"{'would remove' if s.dry_run else 'removed'} {r.jobs:,} jobs that ended before "
        f"{s.before:%Y-%m-%d %H:%M:%S %Z} ({s.batches} batches, {s.seconds:.1f}s)",
        f"  with {r.executions:,} executions, {r.events:,} events, {r.verdicts:,} verdicts, "
        f"{r.outputs:,} output chunks, {r.dependencies:,} dependencies, "
        f"{r.notifications:,} task notifications, {r.ticks:,} schedule ticks",
    ]
    if k.total:
        lines.append(
            f"kept {k.total:,} jobs that ended before then: {k.held:,} held by another "
            f"transaction (a later prune takes them), {k.unsettled:,} still settling or "
            f"recorded since, {k.needed:,} needed by jobs that stay"
        )
    if s.dry_run:
        lines.append("nothing was deleted (--dry-run)")
    return "\n".join(lines)
