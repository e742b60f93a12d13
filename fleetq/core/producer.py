"""Putting work in and taking it back: submit (also inside a caller's transaction) and
cancel.

Submit validates in Python first (clear messages, nothing echoed), then calls
`fleetq.submit`, which checks again and derives the priority class: the caller never
chooses one. An idempotency key makes a retried submit return the job it already made.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NotRequired, TypedDict, Unpack

import psycopg
from psycopg.rows import dict_row

from fleetq.core import queries, validation
from fleetq.core.driver import DEFAULT_TIMEOUT_S, Driver, mapped_errors
from fleetq.core.errors import InvalidInput
from fleetq.core.models import CancelResult, JobId, SubmitResult


class SubmitFields(TypedDict):
    """What a submit names; the caller never picks a priority (it is derived)."""

    project: str
    operation: str
    commit: str
    submitted_by: str
    requested_node: NotRequired[str | None]
    idempotency_key: NotRequired[str | None]
    task_id: NotRequired[str | None]
    payload: NotRequired[dict[str, Any] | None]
    after: NotRequired[list[int] | None]  # jobs that must succeed first
    traceparent: NotRequired[str | None]  # W3C trace context, handed to the job


def _params(fields: SubmitFields) -> list[object]:
    """Validated parameters of `jobs_submit`, in order; nothing unchecked reaches SQL."""
    return [
        validation.text(fields["project"], "project"),
        validation.text(fields["operation"], "operation"),
        validation.commit_sha(fields["commit"]),
        validation.optional_text(fields.get("requested_node"), "node"),
        validation.optional_text(fields.get("idempotency_key"), "idempotency key"),
        validation.optional_text(fields.get("task_id"), "task id"),
        validation.text(fields["submitted_by"], "submitted by"),
        validation.payload(fields.get("payload")),
        validation.job_ids(fields.get("after"), "after"),
        validation.traceparent(fields.get("traceparent")),
    ]


async def submit(driver: Driver, **fields: Unpack[SubmitFields]) -> SubmitResult:
    """Enqueue a job; with an idempotency key, a repeat returns the same job
    (`created=False`) and a different request under that key raises
    `IdempotencyConflict`. With `after`, the job waits (state `waiting`) until those
    jobs have succeeded, and is cancelled if one of them fails, is refused or cancelled."""
    rows = await driver.fetch(queries.sql("jobs_submit"), *_params(fields))
    return SubmitResult.model_validate(rows[0])


async def rerun(
    driver: Driver, *, job_id: JobId, submitted_by: str, idempotency_key: str | None = None
) -> SubmitResult:
    """Submit an ended job's check again: a new job, linked to the old by a `rerun` event.
    A live job is refused for now (`RefusedNow`), an unknown one is `NotFound`."""
    rows = await driver.fetch(
        queries.sql("jobs_rerun"),
        job_id,
        validation.text(submitted_by, "submitting identity"),
        None if idempotency_key is None else validation.text(idempotency_key, "idempotency key"),
    )
    return SubmitResult.model_validate(rows[0])


class JobSpec(TypedDict):
    """One job of a batch (`submit_many`): a submit's fields but who submits (the batch's)
    and dependencies (submit those one by one, with `after`)."""

    project: str
    operation: str
    commit: str
    requested_node: NotRequired[str | None]
    idempotency_key: NotRequired[str | None]
    task_id: NotRequired[str | None]
    payload: NotRequired[dict[str, Any] | None]
    traceparent: NotRequired[str | None]


def _batch_params(jobs: Sequence[JobSpec], submitted_by: str) -> list[object]:
    """Validated columns of `jobs_submit_many`; a bad job is named by its position."""
    columns: list[list[object]] = [[] for _ in range(8)]
    for n, job in enumerate(jobs, start=1):
        try:
            row = _params(
                SubmitFields(
                    project=job["project"],
                    operation=job["operation"],
                    commit=job["commit"],
                    submitted_by=submitted_by,
                    requested_node=job.get("requested_node"),
                    idempotency_key=job.get("idempotency_key"),
                    task_id=job.get("task_id"),
                    payload=job.get("payload"),
                    traceparent=job.get("traceparent"),
                )
            )
        except KeyError as exc:
            raise InvalidInput(f"job {n}: {exc.args[0]} is required") from None
        except InvalidInput as exc:
            raise InvalidInput(f"job {n}: {exc}") from None
        for column, value in zip(columns, (*row[:6], row[7], row[9]), strict=True):
            column.append(value)
    return [*columns, validation.text(submitted_by, "submitted by")]


async def submit_many(
    driver: Driver, jobs: Sequence[JobSpec], *, submitted_by: str
) -> list[SubmitResult]:
    """Enqueue many jobs in one statement: one insert of jobs, one of events and one
    NOTIFY per lane, instead of a call per job. All or nothing: every job is checked
    before any is written, and a bad one is named by its position (from 1). An
    idempotency key that names an existing job answers it (`created=False`). Answers in
    input order."""
    if not jobs:
        return []
    # a big batch is one long statement: a second per 10,000 jobs on top of the default
    rows = await driver.fetch(
        queries.sql("jobs_submit_many"),
        *_batch_params(jobs, submitted_by),
        timeout=DEFAULT_TIMEOUT_S + len(jobs) / 10_000,
    )
    return [SubmitResult.model_validate(row) for row in rows]


def submit_in_transaction(
    conn: psycopg.Connection[Any], **fields: Unpack[SubmitFields]
) -> SubmitResult:
    """Enqueue on the caller's own psycopg connection, inside whatever transaction it has
    open: the job commits or rolls back with the application's writes."""
    with mapped_errors(), psycopg.RawCursor(conn, row_factory=dict_row) as cursor:
        cursor.execute(queries.sql("jobs_submit"), _params(fields))
        row = cursor.fetchone()
    assert row is not None
    return SubmitResult.model_validate(row)


async def cancel(driver: Driver, *, job_id: JobId, actor: str, reason: str = "") -> CancelResult:
    """Cancel a job: terminal at once; a live one shows "stop pending" until its runner
    confirms the stop. Cancelling a finished job changes nothing."""
    rows = await driver.fetch(
        queries.sql("jobs_cancel"),
        job_id,
        validation.text(actor, "actor"),
        validation.reason(reason),
    )
    return CancelResult.model_validate(rows[0])
