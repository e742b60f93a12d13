"""`fleetq rerun JOB`: submit an ended job's check again, as a new job linked to it.

Why a verb: a flaky failure or a runner's fault is retried by hand, and retyping the
project, operation, commit and payload of job 412 loses what ties the two together; the
new job's `rerun` event names the one it repeats."""

from __future__ import annotations

import argparse

from fleetq.cli.common import Commands, actor, add_actor, add_json, job_id_arg, run
from fleetq.cli.output import emit_json
from fleetq.cli.submit import warn_if_nobody_can
from fleetq.core import producer
from fleetq.core.models import JobId


def register(commands: Commands) -> None:
    """Add `rerun`."""
    p = commands.add_parser(
        "rerun",
        help="submit an ended job's check again (a new job, linked to the old)",
        description="Submit JOB's check again: a new job of the same project, operation, "
        "commit, node, task and payload, under the operation's current definition, "
        "submitted as you; its `rerun` event names JOB. A job still waiting, queued or "
        "running is refused (exit 75): it has decided nothing yet. Prints the new job's "
        "id; `fleetq wait` waits for its verdict.",
    )
    p.add_argument("job_id", type=job_id_arg, metavar="JOB")
    p.add_argument(
        "--key", help="idempotency key: running the same rerun again answers the same job"
    )
    add_actor(p)
    add_json(p)
    p.set_defaults(func=_do_rerun)


def _do_rerun(args: argparse.Namespace) -> int:
    key = f" with --key {args.key}, running it again is safe" if args.key else ""
    args.interrupted_note = (
        f" while submitting the rerun: it may or may not have been queued (`fleetq jobs` "
        f"shows it{key})"
    )
    answer = run(
        args,
        lambda d: producer.rerun(
            d, job_id=JobId(args.job_id), submitted_by=actor(args), idempotency_key=args.key
        ),
    )
    if args.json:
        emit_json({**answer.model_dump(mode="json"), "rerun_of": args.job_id})
    elif answer.created:
        print(f"job {answer.job_id} {answer.state}: a rerun of job {args.job_id}")
    else:
        print(f"job {answer.job_id} already exists for this key (state {answer.state})")
    if answer.created:
        args.interrupted_note = f" after job {answer.job_id} was queued"
        warn_if_nobody_can(args, answer.job_id)
    return 0
