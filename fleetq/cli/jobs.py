"""Commands about jobs already submitted: cancel, jobs, explain, events, reap.

(`fleetq submit` and `fleetq result` have modules of their own.)
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Any

from fleetq.cli.common import (
    Commands,
    actor,
    add_actor,
    add_json,
    age,
    duration,
    job_id_arg,
    positive_arg,
    run,
)
from fleetq.cli.exits import Exit
from fleetq.cli.output import emit_json, table
from fleetq.core import eligibility, leasing, producer, readers
from fleetq.core.errors import NotFound
from fleetq.core.models import (
    CancelResult,
    Job,
    JobId,
    JobState,
)
from fleetq.core.text import escape


def register(commands: Commands) -> None:
    """Add the job commands."""
    _cancel(commands)
    _jobs(commands)
    _explain(commands)
    _events(commands)
    _reap(commands)


def _cancel(commands: Commands) -> None:
    p = commands.add_parser(
        "cancel",
        help="cancel jobs",
        description="Cancel jobs: each is terminal at once. A running one shows 'stop pending' "
        "until its runner confirms the process stopped.",
    )
    p.add_argument("job_ids", nargs="+", type=job_id_arg, metavar="JOB")
    p.add_argument("--reason", default="", help="why (kept with the job and its events)")
    add_actor(p)
    add_json(p)
    p.set_defaults(func=_do_cancel)


def _do_cancel(args: argparse.Namespace) -> int:
    """Each id on its own: one unknown id neither stops the others nor hides that they
    were cancelled (exit 65 when any was unknown)."""

    async def work(d: Any) -> list[CancelResult | NotFound]:
        answers: list[CancelResult | NotFound] = []
        for j in args.job_ids:
            try:
                answers.append(
                    await producer.cancel(d, job_id=JobId(j), actor=actor(args), reason=args.reason)
                )
            except NotFound as exc:
                answers.append(exc)
        return answers

    answers = run(args, work)
    unknown = [j for j, a in zip(args.job_ids, answers, strict=True) if isinstance(a, NotFound)]
    results = [a for a in answers if isinstance(a, CancelResult)]
    status = Exit.DATA if unknown else Exit.OK
    if args.json:
        emit_json({"cancelled": [r.model_dump(mode="json") for r in results], "unknown": unknown})
        return status
    for j in unknown:
        print(f"job {j}: no such job", file=sys.stderr)
    for r in results:
        if r.previous_state.terminal:
            print(f"job {r.job_id} was already {r.previous_state}: nothing to cancel")
        elif r.stop_pending:
            print(
                f"job {r.job_id} cancelled (was {r.previous_state}); stop pending until its "
                "runner confirms the process stopped"
            )
        else:
            print(f"job {r.job_id} cancelled (was {r.previous_state})")
    return status


def _ran(job: Job, now: datetime) -> str:
    """How long its (last) run took, or has taken so far."""
    if job.started_at is None:
        return ""
    return duration((job.finished_at or now) - job.started_at)


def _jobs(commands: Commands) -> None:
    p = commands.add_parser("jobs", help="list jobs, newest first")
    p.add_argument("--state", choices=[s.value for s in JobState])
    p.add_argument("--lane")
    p.add_argument("--project")
    p.add_argument("--runner", help="jobs this runner holds (or must still confirm stopped)")
    p.add_argument("--limit", type=positive_arg, default=50, help="at most this many (default 50)")
    add_json(p)
    p.set_defaults(func=_do_jobs)


def _do_jobs(args: argparse.Namespace) -> int:
    found = run(
        args,
        lambda d: readers.jobs(
            d,
            state=JobState(args.state) if args.state else None,
            lane=args.lane,
            project=args.project,
            runner=args.runner,
            limit=args.limit,
        ),
    )
    if args.json:
        emit_json(found)
        return 0
    now = datetime.now(UTC)
    rows = [
        [
            j.id,
            j.state + (" (stop pending)" if j.stop_pending else ""),
            j.lane,
            j.project,
            j.operation,
            j.commit_sha[:12],
            j.lease_owner or j.released_by or "",
            j.lease_version,
            age(now, j.lease_expires_at) if j.lease_expires_at else "",
            _ran(j, now),
            f"{j.lost_count}/{j.reassign_count}",
            age(j.created_at, now),
        ]
        for j in found
    ]
    print(
        table(
            [
                "id",
                "state",
                "lane",
                "project",
                "operation",
                "commit",
                "runner",
                "token",
                "lease left",
                "ran",
                "lost/reassigned",
                "age",
            ],
            rows,
        )
    )
    return 0


def _explain(commands: Commands) -> None:
    p = commands.add_parser(
        "explain",
        help="which runners could run a job now, and why the others cannot",
        description="Evaluates the claim's own eligibility rule for JOB against every runner.",
    )
    p.add_argument("job_id", type=job_id_arg, metavar="JOB")
    add_json(p)
    p.set_defaults(func=_do_explain)


def _do_explain(args: argparse.Namespace) -> int:
    async def work(d: Any) -> tuple[Job, eligibility.Explanation]:
        job = await readers.job(d, JobId(args.job_id))  # NotFound for no such job
        return job, await eligibility.explain(d, JobId(args.job_id))

    job, explained = run(args, work)
    state = job.state
    if args.json:
        emit_json(
            {
                "job_id": explained.job_id,
                "state": state.value,
                "finished": state.terminal,
                "waiting_on": job.waiting_on,
                "never": explained.never,
                "summary": explained.summary(),
                "runners": [
                    {
                        "runner": v.runner_id,
                        "eligible": v.eligible,
                        "reason": v.reason,
                        "why": v.describe(),
                    }
                    for v in explained.runners
                ],
            }
        )
        return 0
    if state.terminal:
        print(f"job {args.job_id} is finished ({state}): no runner will take it again; as for")
        print("a job like it now:")
    if state == JobState.WAITING:
        print(
            f"job {args.job_id} is waiting on {', '.join(map(str, job.waiting_on))}: no runner "
            "takes it before they have succeeded; then, as now:"
        )
    print(escape(explained.summary()))  # it names capabilities, nodes, lanes: untrusted
    if explained.never and explained.runners:
        print("no registered runner could ever run it: it waits until one that can registers")
    if explained.runners:
        print(
            table(["runner", "verdict"], [[v.runner_id, v.describe()] for v in explained.runners])
        )
    return 0


def _events(commands: Commands) -> None:
    p = commands.add_parser("events", help="the event history, oldest first")
    p.add_argument("--job", type=job_id_arg, metavar="JOB")
    p.add_argument("--runner")
    p.add_argument("--after", type=positive_arg, metavar="ID", help="only events after this id")
    p.add_argument(
        "--limit", type=positive_arg, default=100, help="at most this many (default 100)"
    )
    add_json(p)
    p.set_defaults(func=_do_events)


def _do_events(args: argparse.Namespace) -> int:
    found = run(
        args,
        lambda d: readers.events(
            d, after=args.after, job_id=args.job, runner=args.runner, limit=args.limit
        ),
    )
    if args.json:
        emit_json(found)
        return 0
    rows = [
        [
            e.id,
            e.at.astimezone().strftime("%H:%M:%S.%f")[:-3],
            e.kind,
            e.job_id or "",
            e.runner_id or "",
            e.lease_version if e.lease_version is not None else "",
            e.actor or "",
            json.dumps(e.detail, sort_keys=True) if e.detail else "",
        ]
        for e in found
    ]
    print(table(["id", "at", "kind", "job", "runner", "token", "actor", "detail"], rows))
    return 0


def _reap(commands: Commands) -> None:
    p = commands.add_parser(
        "reap",
        help="return expired leases to the queue (one pass)",
        description="One reaper pass. Only one reaper leads at a time (it locks the reaper's "
        "row of fleetq.coordination for the pass); runners host it too, so this is for "
        "operators and cron.",
    )
    add_json(p)
    p.set_defaults(func=_do_reap)


def _do_reap(args: argparse.Namespace) -> int:
    result = run(args, lambda d: leasing.reap(d))
    if args.json:
        emit_json(result)
    elif not result.leader:
        print("another reaper is leading right now; nothing done", file=sys.stderr)
    else:
        print(
            f"reaped: {result.requeued} requeued, {result.failed} failed (reassignments exhausted)"
        )
    return 0
