"""Putting work in and taking it back: submit (also inside a caller's transaction) and
cancel.

Submit validates in Python first (clear messages, nothing echoed), then calls
`fleetq.submit`, which checks again and derives the priority class: the caller never
chooses one. An idempotency key makes a retried submit return the job it already made.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from fleetq.core import queries, validation
from fleetq.core.driver import Driver, mapped_errors
from fleetq.core.models import CancelResult, JobId, SubmitResult


def _params(
    *,
    project: str,
    operation: str,
    commit: str,
    requested_node: str | None,
    idempotency_key: str | None,
    task_id: str | None,
    submitted_by: str,
    payload: dict[str, Any] | None,
) -> list[object]:
    return [
        validation.text(project, "project"),
        validation.text(operation, "operation"),
        validation.commit_sha(commit),
        validation.optional_text(requested_node, "node"),
        validation.optional_text(idempotency_key, "idempotency key"),
        validation.optional_text(task_id, "task id"),
        validation.text(submitted_by, "submitted by"),
        validation.payload(payload),
    ]


async def submit(
    driver: Driver,
    *,
    project: str,
    operation: str,
    commit: str,
    submitted_by: str,
    requested_node: str | None = None,
    idempotency_key: str | None = None,
    task_id: str | None = None,
    payload: dict[str, Any] | None = None,
) -> SubmitResult:
    """Enqueue a job; with an idempotency key, a repeat returns the same job
    (`created=False`) and a different request under that key raises
    `IdempotencyConflict`."""
    params = _params(
        project=project,
        operation=operation,
        commit=commit,
        requested_node=requested_node,
        idempotency_key=idempotency_key,
        task_id=task_id,
        submitted_by=submitted_by,
        payload=payload,
    )
    rows = await driver.fetch(queries.sql("jobs_submit"), *params)
    return SubmitResult.model_validate(rows[0])


def submit_in_transaction(
    conn: psycopg.Connection[Any],
    *,
    project: str,
    operation: str,
    commit: str,
    submitted_by: str,
    requested_node: str | None = None,
    idempotency_key: str | None = None,
    task_id: str | None = None,
    payload: dict[str, Any] | None = None,
) -> SubmitResult:
    """Enqueue on the caller's own psycopg connection, inside whatever transaction it has
    open: the job commits or rolls back with the application's writes."""
    params = _params(
        project=project,
        operation=operation,
        commit=commit,
        requested_node=requested_node,
        idempotency_key=idempotency_key,
        task_id=task_id,
        submitted_by=submitted_by,
        payload=payload,
    )
    with mapped_errors(), psycopg.RawCursor(conn, row_factory=dict_row) as cursor:
        cursor.execute(queries.sql("jobs_submit"), params)
        row = cursor.fetchone()
    assert row is not None
    return SubmitResult.model_validate(row)


async def cancel(driver: Driver, *, job_id: JobId, actor: str, reason: str = "") -> CancelResult:
    """Cancel a job: terminal at once; a live one shows "stop pending" until its runner
    confirms the stop. Cancelling a finished job changes nothing."""
    rows = await driver.fetch(
        queries.sql("jobs_cancel"), job_id, validation.text(actor, "actor"), reason
    )
    return CancelResult.model_validate(rows[0])
