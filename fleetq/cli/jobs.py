"""Job commands: submit, cancel, result, jobs, explain, events, reap."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

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
    seconds_arg,
)
from fleetq.cli.exits import DECISION_EXIT, Exit
from fleetq.cli.output import emit_json, table
from fleetq.core import eligibility, leasing, producer, readers, validation, waiting
from fleetq.core.db import connect, resolve_dsn
from fleetq.core.errors import ConnectionFailed, FleetqError, InvalidInput, NotFound
from fleetq.core.models import (
    VERDICTS,
    CancelResult,
    Job,
    JobId,
    JobState,
    ResultAnswer,
    decision,
)
from fleetq.core.text import escape


def register(commands: Commands) -> None:
    """Add the job commands."""
    _submit(commands)
    _cancel(commands)
    _result(commands)
    _jobs(commands)
    _explain(commands)
    _events(commands)
    _reap(commands)


def _submit(commands: Commands) -> None:
    p = commands.add_parser(
        "submit",
        help="submit a job: PROJECT OPERATION at an exact commit (or a file of jobs)",
        description="Submit a job. The priority is derived (release-verification identities "
        "first, then release-gate projects, then the rest), never chosen. With --key, a "
        "repeat returns the existing job instead of making a second one.",
    )
    p.add_argument("project", nargs="?")
    p.add_argument("operation", nargs="?")
    p.add_argument("--commit", metavar="SHA", help="the full 40-hex commit")
    p.add_argument(
        "--from-file",
        metavar="FILE",
        help="submit every job of FILE (`-`: stdin) in one statement, all or nothing: JSON "
        'lines, each {"project", "operation", "commit", and optionally "node", "key", '
        '"task", "payload", "traceparent"}',
    )
    p.add_argument("--node", help="run only on this node")
    p.add_argument("--key", help="idempotency key, unique per project")
    p.add_argument("--task", help="task id: its thread is notified of the outcome")
    p.add_argument("--payload", metavar="JSON", help="a JSON object for the job")
    p.add_argument("--payload-file", type=Path, metavar="FILE", help="read the payload from FILE")
    p.add_argument(
        "--traceparent",
        metavar="HEADER",
        help="W3C trace context to continue (default: $TRACEPARENT); the job gets it as "
        "TRACEPARENT",
    )
    p.add_argument(
        "--after",
        nargs="+",
        type=int,
        metavar="JOB",
        help="wait until these jobs have succeeded (state waiting); cancelled if one fails, "
        "is refused or cancelled",
    )
    add_actor(p)
    add_json(p)
    p.set_defaults(func=_do_submit)


def _payload(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.payload and args.payload_file:
        raise InvalidInput("give --payload or --payload-file, not both")
    text = _read_payload_file(args.payload_file) if args.payload_file else args.payload
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(
            f"payload is not valid JSON (line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise InvalidInput("payload nests too deeply to be read") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise InvalidInput(f"payload: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput("payload must be a JSON object")
    return value


def _read_payload_file(path: Path, option: str = "--payload-file") -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(f"{option} {path}: no such file") from None
    except IsADirectoryError:
        raise InvalidInput(f"{option} {path}: is a directory") from None
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{option} {path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise InvalidInput(f"{option} {path}: {exc.strerror}") from None


def _traceparent(args: argparse.Namespace) -> str | None:
    """--traceparent (refused when malformed), else $TRACEPARENT, which a submit inherits
    from whatever ran it: a malformed one there is ignored with a warning, not an error."""
    if args.traceparent is not None:
        return args.traceparent  # type: ignore[no-any-return]
    inherited = os.environ.get("TRACEPARENT")
    if not inherited:
        return None
    try:
        return validation.traceparent(inherited)
    except InvalidInput as exc:
        print(f"fleetq: ignoring $TRACEPARENT: {exc}", file=sys.stderr)
        return None


def _do_submit(args: argparse.Namespace) -> int:
    if args.from_file is not None:
        return _submit_file(args)
    if not (args.project and args.operation and args.commit):
        raise InvalidInput("give PROJECT OPERATION --commit SHA, or --from-file FILE")
    payload = _payload(args)
    key = f" with --key {args.key}, submitting again is safe" if args.key else ""
    args.interrupted_note = (
        " while submitting: the job may or may not have been queued "
        f"(`fleetq jobs --project {args.project}` shows it{key})"
    )
    answer = run(
        args,
        lambda d: producer.submit(
            d,
            project=args.project,
            operation=args.operation,
            commit=args.commit,
            submitted_by=actor(args),
            requested_node=args.node,
            idempotency_key=args.key,
            task_id=args.task,
            payload=payload,
            after=args.after,
            traceparent=_traceparent(args),
        ),
    )
    if args.json:
        emit_json(answer)
    elif answer.created and answer.state == JobState.WAITING:
        waits = ", ".join(str(j) for j in sorted(set(args.after or [])))
        print(
            f"job {answer.job_id} waiting on {waits} (priority class {answer.priority_class}); "
            "queued when they have succeeded"
        )
    elif answer.created and answer.state == JobState.CANCELLED:
        job = run(args, lambda d: readers.job(d, answer.job_id))
        print(f"job {answer.job_id} cancelled at once: {escape(job.cancel_reason or '')}")
    elif answer.created:
        print(f"job {answer.job_id} queued (priority class {answer.priority_class})")
    else:
        print(
            f"job {answer.job_id} already exists for key '{escape(args.key)}' "
            f"(state {answer.state}); "
            "nothing new was queued"
        )
    if answer.created:
        args.interrupted_note = f" after job {answer.job_id} was queued"
        warn_if_nobody_can(args, answer.job_id)
    return 0


_FILE_FIELDS = {
    "project": "project",
    "operation": "operation",
    "commit": "commit",
    "node": "requested_node",
    "key": "idempotency_key",
    "task": "task_id",
    "payload": "payload",
    "traceparent": "traceparent",
}


def _submit_file(args: argparse.Namespace) -> int:
    """`submit --from-file`: every job of a JSON-lines file in one statement."""
    given = [
        flag
        for flag, value in (
            ("PROJECT", args.project),
            ("--commit", args.commit),
            ("--after", args.after),
            ("--payload", args.payload),
            ("--payload-file", args.payload_file),
            ("--node", args.node),
            ("--key", args.key),
            ("--task", args.task),
            ("--traceparent", args.traceparent),
        )
        if value
    ]
    if given:
        raise InvalidInput(
            f"--from-file takes every job from the file: {given[0]} belongs in its lines"
        )
    jobs, lines = _read_jobs(args.from_file)
    inherited = _traceparent(args)  # $TRACEPARENT, for the lines that carry none
    if inherited:
        for job in jobs:
            job.setdefault("traceparent", inherited)
    args.interrupted_note = (
        " while submitting: the file's jobs were queued all or none (`fleetq jobs` shows "
        "which; with keys, submitting the file again is safe)"
    )
    try:
        answers = run(args, lambda d: producer.submit_many(d, jobs, submitted_by=actor(args)))
    except FleetqError as exc:
        # the batch names a job by its position; a person wants the file's line
        message = re.sub(r"^job (\d+):", lambda m: f"line {lines[int(m.group(1)) - 1]}:", str(exc))
        if isinstance(exc, ConnectionFailed):  # timed out or cut: the outcome is unknown
            raise type(exc)(
                f"{args.from_file}: {message} (all of the file's jobs or none were queued: "
                "`fleetq jobs` shows which; with keys, submitting it again is safe)"
            ) from exc
        raise type(exc)(f"{args.from_file}: {message}; nothing was queued") from exc
    if args.json:
        emit_json(answers)
        return 0
    made = sum(a.created for a in answers)
    print(
        f"{made} job(s) queued from {args.from_file}"
        + (f"; {len(answers) - made} already existed for their keys" if made < len(answers) else "")
    )
    return 0


def _read_jobs(name: str) -> tuple[list[producer.JobSpec], list[int]]:
    """The jobs of a JSON-lines file (blank lines skipped) and each one's line number."""
    text = sys.stdin.read() if name == "-" else _read_payload_file(Path(name), "--from-file")
    jobs: list[producer.JobSpec] = []
    lines: list[int] = []
    # lines end at \n only: str.splitlines() would also cut at U+2028 or a form feed,
    # which a JSON string may hold
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.removesuffix("\r")
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInput(
                f"{name}: line {number}: not valid JSON (column {exc.colno})"
            ) from None
        except RecursionError:
            raise InvalidInput(f"{name}: line {number}: nests too deeply to be read") from None
        except ValueError as exc:  # e.g. an integer of more digits than Python converts
            raise InvalidInput(f"{name}: line {number}: {exc}") from None
        if not isinstance(value, dict):
            raise InvalidInput(f"{name}: line {number}: a job is a JSON object")
        unknown = sorted(set(value) - set(_FILE_FIELDS))
        if unknown:
            raise InvalidInput(
                f"{name}: line {number}: unknown field {unknown[0]!r} "
                f"(fields: {', '.join(_FILE_FIELDS)})"
            )
        missing = [f for f in ("project", "operation", "commit") if f not in value]
        if missing:
            raise InvalidInput(f"{name}: line {number}: {missing[0]} is required")
        jobs.append(cast(producer.JobSpec, {_FILE_FIELDS[k]: v for k, v in value.items()}))
        lines.append(number)
    if not jobs:
        raise InvalidInput(f"{name}: no job in it")
    return jobs, lines


def warn_if_nobody_can(args: argparse.Namespace, job: JobId) -> None:
    """Say at once when no registered runner could ever run the job (a capability
    nobody has, more memory than any runner has): it would wait with no sign why. (With
    no runner registered yet, or a login that may not read runners, nothing is said.)"""
    try:
        warning = run(args, lambda d: eligibility.never_runnable(d, job))
    except FleetqError:
        return
    if warning is not None:
        print(f"warning: {escape(warning)}", file=sys.stderr)


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


def _ran(job: Job, now: datetime) -> str:
    """How long its (last) run took, or has taken so far."""
    if job.started_at is None:
        return ""
    return duration((job.finished_at or now) - job.started_at)


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
