"""Which runs the self-fence stops: those whose process still runs, never one that has
ended and only waits for its outcome to be written (seen in the failover test: the
finished run was recorded as fenced, and could have been handed back and run again)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from fleetq.runner.config import RunnerConfig
from fleetq.runner.execution import Execution
from fleetq.runner.service import RunnerService
from tests.unit.test_job_env import _claim


def _execution(job: int, *, renewed_s_ago: float) -> Execution:
    return Execution(
        claim=_claim(job_id=job, lease_version=1),
        lane="checks",
        renewed_at=time.monotonic() - renewed_s_ago,
    )


async def test_a_run_that_ended_is_not_fenced_while_its_outcome_waits() -> None:
    service = RunnerService(RunnerConfig(node="n", lanes={"checks": 2}))
    service.lease_seconds = 10
    # the log line of a fence names the pool's use: counters only, no database here
    service.kit = SimpleNamespace(  # type: ignore[assignment]
        pool=SimpleNamespace(get_size=lambda: 1, get_idle_size=lambda: 1, get_max_size=lambda: 6)
    )
    running, ended = _execution(1, renewed_s_ago=60), _execution(2, renewed_s_ago=60)
    ended.ended_monotonic = time.monotonic() - 30  # exited; its outcome write is retried
    service.executions = {running.claim.job_id: running, ended.claim.job_id: ended}
    await service._self_fence_once()
    assert running.stop_reason == "self_fenced" and running.stop.is_set()
    assert ended.stop_reason is None and not ended.stop.is_set()
