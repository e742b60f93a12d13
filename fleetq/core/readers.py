"""Reading the queue: jobs, events, and the result reader for (project, commit)."""

from __future__ import annotations

from fleetq.core import queries, validation
from fleetq.core.driver import Driver
from fleetq.core.errors import NotAllowed, NotFound
from fleetq.core.models import Event, Job, JobId, JobState, Result, ResultAnswer


async def job(driver: Driver, job_id: JobId) -> Job:
    """One job; `NotFound` when there is none."""
    rows = await driver.fetch(queries.sql("jobs_get"), job_id)
    if not rows:
        raise NotFound(f"no job {job_id}")
    return Job.model_validate(rows[0])


async def jobs(
    driver: Driver,
    *,
    state: JobState | None = None,
    lane: str | None = None,
    project: str | None = None,
    runner: str | None = None,
    limit: int = 100,
) -> list[Job]:
    """Jobs, newest first, filtered."""
    rows = await driver.fetch(
        queries.sql("jobs_list"), state.value if state else None, lane, project, runner, limit
    )
    return [Job.model_validate(row) for row in rows]


async def events(
    driver: Driver,
    *,
    after: int | None = None,
    job_id: JobId | None = None,
    runner: str | None = None,
    limit: int = 200,
) -> list[Event]:
    """Events oldest first: those after an id (to follow), else the newest `limit`."""
    if after is None:
        rows = await driver.fetch(queries.sql("jobs_latest_events"), job_id, runner, limit)
    else:
        rows = await driver.fetch(queries.sql("jobs_events"), after, job_id, runner, limit)
    return [Event.model_validate(row) for row in rows]


async def verdict(driver: Driver, job_id: int) -> Result | None:
    """One job's verdict with its provenance; None when it decided nothing (yet)."""
    (checked,) = validation.job_ids([job_id], "a job") or [job_id]
    rows = await driver.fetch(queries.sql("jobs_verdict"), checked)
    return Result.model_validate(rows[0]) if rows else None


async def result(
    driver: Driver, *, project: str, commit: str, operation: str | None = None
) -> list[ResultAnswer]:
    """Per operation at this commit: its newest verdict (passed, failed, error, refused),
    which a later cancelled or live job never hides, that newer job beside it; with no
    verdict, the newest job (live or cancelled); 'none' if never asked."""
    project = validation.text(project, "project")
    operation = validation.optional_text(operation, "operation")
    commit = validation.commit_sha(commit)
    known = await driver.fetch(queries.sql("jobs_known_operations"), project)
    if not known:
        raise NotAllowed(f"unknown project {project!r} (`fleetq apply` registers projects)")
    operations = list(known[0]["operations"])
    if operation is not None and operation not in operations:
        raise NotAllowed(
            f"project {project!r} has no operation {operation!r} "
            f"(it has: {', '.join(operations) or 'none'})"
        )
    job_rows = await driver.fetch(queries.sql("jobs_for_commit"), project, commit, operation)
    verdicts = {
        r.operation: r
        for r in (
            Result.model_validate(row)
            for row in await driver.fetch(
                queries.sql("jobs_results_for_commit"), project, commit, operation
            )
        )
    }
    answers: list[ResultAnswer] = []
    for op in sorted({str(r["operation"]) for r in job_rows} | set(verdicts)):
        newest = next((r for r in job_rows if r["operation"] == op), None)
        verdict = verdicts.get(op)
        if verdict is None:
            assert newest is not None  # an operation is listed for a job or a verdict
            state = JobState(newest["state"])
            answers.append(
                ResultAnswer(
                    operation=op,
                    status="cancelled" if state == JobState.CANCELLED else "live",
                    job_id=newest["id"],
                    job_state=state,
                    reason=newest["failure_reason"],
                )
            )
            continue
        newer = newest if newest is not None and newest["id"] > verdict.job_id else None
        answers.append(
            ResultAnswer(
                operation=op,
                status=verdict.verdict,
                job_id=verdict.job_id,
                exit_code=verdict.exit_code,
                reason=verdict.reason,
                recorded_at=verdict.recorded_at,
                log_tail=verdict.log_tail,
                provenance=verdict.provenance,
                newer_job_id=None if newer is None else newer["id"],
                newer_state=None if newer is None else JobState(newer["state"]),
            )
        )
    if operation is not None and not answers:
        answers.append(ResultAnswer(operation=operation, status="none"))
    return answers
