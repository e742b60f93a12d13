"""A bug that ends one of the runner's loops ends the runner the careful way: every job
stopped at once and its lease handed back, waiting executions answered, exit 70."""

from __future__ import annotations

import asyncio

import pytest

from fleetq.core.models import OutcomeReport
from fleetq.runner.config import RunnerConfig
from fleetq.runner.reporter import OutcomeNotRecorded, Reporter
from fleetq.runner.service import EXIT_BUG, RunnerService


async def _bug() -> None:
    raise KeyError("a bug in fleetq")


async def test_a_bug_in_a_loop_asks_for_an_immediate_shutdown() -> None:
    service = RunnerService(RunnerConfig(node="n", lanes={"checks": 1}))
    await service._guarded("heartbeat", _bug())
    assert service.exit_code == EXIT_BUG
    assert service.shutdown_requested.is_set() and service.immediate


async def test_a_dead_reporter_answers_the_executions_waiting_on_it() -> None:
    """Otherwise an execution waits forever for its outcome write, and so does the
    shutdown that must hand its lease back."""
    reporter = Reporter(driver=None, runner="n/r")  # type: ignore[arg-type]
    report = OutcomeReport.model_validate(
        {"job_id": 1, "lease_version": 1, "outcome": "succeeded", "exit_code": 0}
    )
    waiting = asyncio.ensure_future(reporter.record(report))
    await asyncio.wait_for(reporter.wake.wait(), 5)  # queued
    reporter.abandon(KeyError("a bug"))
    with pytest.raises(OutcomeNotRecorded):
        await asyncio.wait_for(waiting, 5)
    with pytest.raises(OutcomeNotRecorded):
        await reporter.record(report)
