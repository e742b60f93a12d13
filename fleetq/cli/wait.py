"""`fleetq wait JOB… [--timeout S]`: block until the jobs end (woken by the database, no
polling) and exit with their verdict, as `fleetq result` does: a CI gate's one line."""

from __future__ import annotations

import argparse

from fleetq.cli.common import Commands, add_json, job_id_arg, seconds_arg
from fleetq.cli.exits import DECISION_EXIT
from fleetq.cli.output import emit_json
from fleetq.core import migrate, queries, waiting
from fleetq.core.db import SyncConnection, connect, resolve_dsn
from fleetq.core.models import JobId, JobState, ResultAnswer, decision
from fleetq.core.text import escape


def register(commands: Commands) -> None:
    """Add `wait`."""
    p = commands.add_parser(
        "wait",
        help="wait for jobs to end; exit with their verdict (a CI gate)",
        description="Blocks until every JOB has ended, woken by the database when one "
        "does (no polling), then prints each one's verdict. Exit status as `fleetq "
        "result`: 0 all passed; 1 one ran and failed; 3 none failed but one could not run "
        "(error, refused); 2 not decided (cancelled, or still live at --timeout); 65 a job "
        "that does not exist.",
    )
    p.add_argument("job_ids", type=job_id_arg, nargs="+", metavar="JOB")
    p.add_argument(
        "--timeout",
        type=seconds_arg,
        metavar="S",
        help="give up after S seconds (exit 2, the jobs still live are named); default: "
        "wait as long as it takes",
    )
    add_json(p)
    p.set_defaults(func=_do_wait)


def _do_wait(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args.dsn), autocommit=True) as conn:
        migrate.require_current(conn)
        answers = wait_and_judge(conn, [JobId(j) for j in args.job_ids], args.timeout)
    if args.json:
        emit_json(answers)
    else:
        for a in answers:
            print(describe(a))
    return DECISION_EXIT[decision(answers)]


def wait_and_judge(
    conn: SyncConnection, jobs: list[JobId], timeout_s: float | None
) -> list[ResultAnswer]:
    """Wait for `jobs`, then each one's verdict (or its state, when it decided nothing)."""
    states = waiting.wait_for(conn, jobs, timeout_s=timeout_s)
    rows = conn.execute(queries.sql("watch_verdicts").encode(), [list(states)]).fetchall()
    found = {int(r[0]): r for r in rows}
    answers: list[ResultAnswer] = []
    for job, state in states.items():
        if (row := found.get(job)) is None:  # pruned since it ended: nothing to tell
            answers.append(ResultAnswer(operation="", status="none", job_id=job, job_state=state))
            continue
        _, verdict, exit_code, reason, operation, recorded_at, log_tail = row
        decided = verdict is not None and verdict != "cancelled"
        answers.append(
            ResultAnswer(
                operation=str(operation),
                status=str(verdict)
                if decided
                else ("cancelled" if state == JobState.CANCELLED else "live"),
                job_id=job,
                job_state=state,
                exit_code=exit_code if decided else None,
                reason=reason,
                recorded_at=recorded_at if decided else None,
                log_tail=str(log_tail) if decided else "",
            )
        )
    return answers


def describe(answer: ResultAnswer) -> str:
    """One job's line: its verdict, and why when it did not pass."""
    label = f"job {answer.job_id}"
    if answer.status == "live":
        return f"{label} still {answer.job_state} (not decided)"
    words = [label, answer.status]
    if answer.exit_code is not None and answer.status != "passed":
        words.append(f"(exit {answer.exit_code})")
    line = " ".join(words)
    return f"{line}: {escape(answer.reason)}" if answer.reason else line
