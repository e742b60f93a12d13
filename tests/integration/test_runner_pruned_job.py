"""A runner still holding a job that is no longer in the database (`fleetq prune` took
it after its lease moved on and it ended elsewhere: the runner had frozen meanwhile)
stops its run and records nothing. Before, its stop's record unpacked an empty answer
(a bug: the runner exited 70) or retried "unknown job" for ever."""

from __future__ import annotations

from fleetq.core.driver import AsyncpgDriver, Driver
from fleetq.runner.config import RunnerConfig
from fleetq.runner.service import RunnerService
from tests.unit.test_self_fence_rule import _execution

GONE = 424242  # no such job


async def test_a_job_that_is_gone_is_stopped_and_its_stop_recorded_nowhere(
    driver: Driver,
) -> None:
    assert isinstance(driver, AsyncpgDriver)
    service = RunnerService(RunnerConfig(node="n", lanes={"checks": 1}))
    service.driver = driver
    service.runner = "n/r"  # type: ignore[assignment]
    ex = _execution(GONE, renewed_s_ago=0)
    service.executions = {ex.claim.job_id: ex}
    await service._stop_lost([ex.claim.job_id])
    assert ex.stop_reason == "superseded" and ex.stop.is_set()
    for reason in ("superseded", "self_fenced"):
        await service._confirm(ex, reason)  # returns: nothing to record, nothing raised
