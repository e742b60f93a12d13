"""A runner still holding a job that is no longer in the database (`fleetq prune` took
it after its lease moved on and it ended elsewhere: the runner had frozen meanwhile)
stops its run and records nothing. Before, its stop's record unpacked an empty answer
(a bug: the runner exited 70) or retried "unknown job" for ever."""

from __future__ import annotations

from fleetq.core.driver import AsyncpgDriver, Driver
from tests.unit.test_self_fence_rule import _execution, leases

GONE = 424242  # no such job


async def test_a_job_that_is_gone_is_stopped_and_its_stop_recorded_nowhere(
    driver: Driver,
) -> None:
    assert isinstance(driver, AsyncpgDriver)
    ex = _execution(GONE, renewed_s_ago=0)
    kept = leases([ex], 30, driver)
    await kept.stop_lost([ex.claim.job_id])
    assert ex.stop_reason == "superseded" and ex.stop.is_set()
    for reason in ("superseded", "self_fenced"):
        await kept.confirm(ex, reason)  # returns: nothing to record, nothing raised
