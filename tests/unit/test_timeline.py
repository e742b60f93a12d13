"""The job timeline's lanes, from a detail built by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleetq.console.timeline import _describe, lanes
from fleetq.core.models import Event, Job, JobId, JobState
from fleetq.core.views import ExecutionRow, JobDetail

AT = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def test_a_handler_s_start_is_never_drawn_before_its_claim() -> None:
    """Found driving: a handler's row starts at the job's claim time, a hair before the
    claim's event, so S drew left of C and the lane said "start after -0ms"."""
    claimed = AT + timedelta(microseconds=400)  # the event, a little after the job's row
    run = ExecutionRow.model_construct(
        job_id=JobId(1),
        lease_version=1,
        runner_id="n/r",
        node="n",
        run_id=None,
        pid=None,
        claimed_at=None,
        launched_at=AT,
        start_reported_at=AT,
        ended_at=AT + timedelta(seconds=2),
        end_measured=True,
        exit_code=0,
        signal=None,
        stop_reason=None,
        stop_requested_at=None,
        stop_confirmed=False,
    )
    # only the fields the timeline reads
    event = Event.model_construct(kind="claimed", at=claimed, lease_version=1, runner_id="n/r")  # type: ignore[call-arg]
    job = Job.model_construct(lease_version=1, state=JobState.SUCCEEDED)  # type: ignore[call-arg]
    detail = JobDetail.model_construct(job=job, executions=[run], events=[event], now=AT)  # type: ignore[call-arg]
    (lane,) = lanes(detail)
    assert lane.started is not None and lane.claimed is not None
    assert lane.started >= lane.claimed
    assert "-" not in _describe(lane, AT)
