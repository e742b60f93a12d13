"""`fleetq result`: what is known about a project at a commit, as a CI gate's answer.

Why a module of its own: its exit status is a contract (0 passed, 1 failed, 3 could not
run, 2 not decided yet) that CI scripts branch on, and `--wait` blocks on the database
until no check has a live job; the other job commands only report.
"""

from __future__ import annotations

import argparse
import sys
import time

from fleetq.cli.common import (
    Commands,
    add_json,
    run,
    seconds_arg,
)
from fleetq.cli.exits import DECISION_EXIT, Exit
from fleetq.cli.output import emit_json, table
from fleetq.core import readers, waiting
from fleetq.core.db import connect, resolve_dsn
from fleetq.core.models import (
    VERDICTS,
    JobId,
    ResultAnswer,
    decision,
)
from fleetq.core.text import escape


def register(commands: Commands) -> None:
    """Add `fleetq result`."""
    _result(commands)


def _result(commands: Commands) -> None:
    p = commands.add_parser(
        "result",
        help="what is known about PROJECT at COMMIT",
        description="Per operation: its newest verdict (passed: the check ran and passed; "
        "failed: it ran and failed; error: it could not run, for the fleet's reasons: "
        "staging, a command not found, a run lost with its runner; refused: the job asks "
        "for what cannot be run), and beside it a newer job that decided nothing yet "
        "(live, or cancelled: a cancel never hides a verdict). Exit status: 0 every check "
        "passed; 1 one failed; 3 none failed but one could not run (error, refused); 2 not "
        "decided yet (a check with no verdict: live, cancelled or never asked); 64 a "
        "malformed request (a short SHA); 65 an unknown project or operation, which can "
        "never be answered; 69 the database is out of reach. With -v, the end of each "
        "verdict's output too (fleetq logs JOB shows all of it).",
    )
    p.add_argument("project")
    p.add_argument("commit")
    p.add_argument("--operation", help="only this operation")
    p.add_argument(
        "--wait",
        action="store_true",
        help="first wait (woken by the database, no polling) until no check has a live job, "
        "then answer: a CI gate's one line",
    )
    p.add_argument(
        "--timeout",
        type=seconds_arg,
        metavar="S",
        help="with --wait: give up after S seconds (exit 2, naming the jobs still live)",
    )
    add_json(p)
    p.set_defaults(func=_do_result)


def _do_result(args: argparse.Namespace) -> int:
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    while True:
        answers = run(
            args,
            lambda d: readers.result(
                d, project=args.project, commit=args.commit, operation=args.operation
            ),
        )
        live = [job for a in answers if (job := _live_job(a)) is not None]
        left = None if deadline is None else deadline - time.monotonic()
        if not args.wait or not live or (left is not None and left <= 0):
            break
        with connect(resolve_dsn(args.dsn), autocommit=True) as conn:
            waiting.wait_for(conn, live, timeout_s=left)
    if args.json:
        emit_json(answers)
    elif not answers:
        print(f"nothing was ever asked of {escape(args.project)} at {escape(args.commit)}")
    else:
        print(
            table(
                ["operation", "verdict", "job", "exit", "reason", "newer job"],
                [
                    [a.operation, a.status, a.job_id, a.exit_code, a.reason, _newer(a)]
                    for a in answers
                ],
            )
        )
    if args.verbose and not args.json:
        for a in answers:
            if a.log_tail:
                print(f"\n── {escape(a.operation)}: the end of its output (job {a.job_id}) ──")
                print(escape(a.log_tail.rstrip("\n"), one_line=False))
    if args.wait and live:
        # --timeout ran out with a job still to decide: the older verdicts beside it
        # are not what a gate waited for
        jobs = ", ".join(str(j) for j in live)
        print(f"fleetq: timed out waiting; job {jobs} has decided nothing yet", file=sys.stderr)
        return Exit.NOT_YET
    return DECISION_EXIT[decision(answers)]


def _live_job(answer: ResultAnswer) -> JobId | None:
    """The job of a check that is still to decide something: its own, or a newer one."""
    if answer.status == "live":
        return answer.job_id
    if answer.newer_state is not None and not answer.newer_state.terminal:
        return answer.newer_job_id
    return None


def _newer(answer: ResultAnswer) -> str:
    """A job newer than the verdict that decided nothing (yet)."""
    if answer.newer_job_id is None:
        return "" if answer.status in VERDICTS or answer.job_state is None else answer.job_state
    return f"{answer.newer_job_id} {answer.newer_state}"
