"""`fleetq submit`: a job, or a file of jobs, from the command line.

Why a module of its own: submitting is where the command meets what a person types (a
payload inline or from a file, a trace context, a file of many jobs with per-line
errors), none of which the commands about jobs already submitted need.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, cast

from fleetq.cli.common import (
    Commands,
    actor,
    add_actor,
    add_json,
    run,
)
from fleetq.cli.output import emit_json
from fleetq.core import eligibility, producer, readers, validation
from fleetq.core.errors import ConnectionFailed, FleetqError, InvalidInput
from fleetq.core.models import (
    JobId,
    JobState,
    SubmitResult,
)
from fleetq.core.text import escape


def register(commands: Commands) -> None:
    """Add `fleetq submit`."""
    _submit(commands)


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
    _warn_for_shapes(args, jobs, lines, answers)
    return 0


def _warn_for_shapes(
    args: argparse.Namespace,
    jobs: list[producer.JobSpec],
    lines: list[int],
    answers: list[SubmitResult],
) -> None:
    """A file's jobs no registered runner could ever run are said at once, as a single
    submit's are: one check per operation and requested node (what decides it), not one
    per job, naming the file's lines."""
    shapes: dict[tuple[object, ...], list[int]] = {}
    for index, job in enumerate(jobs):
        shape = (job["project"], job["operation"], job.get("requested_node"))
        shapes.setdefault(shape, []).append(index)
    for indices in shapes.values():
        first = answers[indices[0]]
        if first.state != JobState.QUEUED:
            continue
        try:
            warning = run(args, functools.partial(eligibility.never_runnable, job_id=first.job_id))
        except FleetqError:
            return  # a login that may not read runners: said nothing, as for one job
        if warning is not None:
            named = ", ".join(str(lines[i]) for i in indices[:5])
            more = f" and {len(indices) - 5} more" if len(indices) > 5 else ""
            print(
                f"warning: lines {named}{more} of {args.from_file}: {escape(warning)}",
                file=sys.stderr,
            )


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
