"""`fleetq result`: what is known about a project at a commit, as a CI gate's answer.

Why a module of its own: its exit status is a contract (0 passed, 1 failed, 3 could not
run, 2 not decided yet) that CI scripts branch on, and `--wait` blocks on the database
until no check has a live job; the other job commands only report.
"""

from __future__ import annotations

import argparse
import json
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
from fleetq.core import provenance, readers, waiting
from fleetq.core.db import connect, resolve_dsn
from fleetq.core.driver import Driver
from fleetq.core.errors import NotFound
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
        "--diff",
        metavar="OTHER",
        help="what differed besides the commit between each verdict here and OTHER's: "
        "a job id (another verdict of one check, say a rerun on another runner) or another "
        "commit (each operation's newest verdict there); tool versions, runner, machine, "
        "lockfiles, staging, the operation's definition, test counts",
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
    if args.diff is not None:
        return _do_diff(args)
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
                ["operation", "verdict", "job", "exit", "reason", "tests", "newer job"],
                [
                    [a.operation, a.status, a.job_id, a.exit_code, a.reason, _tests(a), _newer(a)]
                    for a in answers
                ],
            )
        )
    if args.verbose and not args.json:
        for a in answers:
            if a.status in VERDICTS:
                print(f"\n── {escape(a.operation)}: what it rests on besides the commit ──")
                for line in provenance.lines(a.provenance):
                    print(escape(line))
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


def _tests(answer: ResultAnswer) -> str:
    return provenance.tests_line((answer.provenance or {}).get("tests"))


def _do_diff(args: argparse.Namespace) -> int:
    """`--diff OTHER`: per verdict here, what differs in OTHER's (a job, or a commit)."""
    other: str = args.diff
    by_job = other.isdigit() and len(other) < 20

    async def read(d: Driver) -> list[provenance.VerdictDiff]:
        here = await readers.result(
            d, project=args.project, commit=args.commit, operation=args.operation
        )
        if by_job:
            theirs = await readers.verdict(d, int(other))
            if theirs is None:
                raise NotFound(f"job {other} has no verdict (yet)")
            jobs = {theirs.operation: theirs.job_id}
        else:
            there = await readers.result(
                d, project=args.project, commit=other, operation=args.operation
            )
            jobs = {a.operation: a.job_id for a in there if a.status in VERDICTS and a.job_id}
        found = []
        for a in here:
            if a.status not in VERDICTS or a.job_id is None or (by_job and a.operation not in jobs):
                continue
            b = await readers.verdict(d, jobs[a.operation]) if a.operation in jobs else None
            mine = (a.job_id, a.status, a.provenance)
            found.append(
                provenance.compare(
                    a.operation, mine, None if b is None else (b.job_id, b.verdict, b.provenance)
                )
            )
        return found

    found = run(args, read)
    if args.json:
        emit_json(found)
    elif not found:
        what = f"{escape(args.project)} at {escape(args.commit)}"
        print(f"fleetq: no verdict of {what} to compare with {escape(other)}", file=sys.stderr)
        return Exit.NOT_YET
    for f in [] if args.json else found:
        if f.other_job is None:
            print(f"{escape(f.operation)}: job {f.job} ({f.verdict}); none at {escape(other)}")
            continue
        print(
            f"{escape(f.operation)}: job {f.job} ({f.verdict}) against job {f.other_job} "
            f"({f.other_verdict})"
        )
        if not f.differences:
            print("  nothing recorded differs")
        for d in f.differences:
            print(f"  {escape(d.what)}: {escape(_shown(d.this))} → {escape(_shown(d.other))}")
    return Exit.OK


def _shown(value: object) -> str:
    return "(none)" if value is None else value if isinstance(value, str) else json.dumps(value)


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
