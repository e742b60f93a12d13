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


def _service(lease_s: int) -> RunnerService:
    service = RunnerService(RunnerConfig(node="n", lanes={"checks": 2}))
    service.lease_seconds = service.offline_after_seconds = lease_s
    service.kit = SimpleNamespace(  # type: ignore[assignment]
        pool=SimpleNamespace(get_size=lambda: 1, get_idle_size=lambda: 1, get_max_size=lambda: 6)
    )
    return service


async def test_a_lease_granted_shorter_than_the_setting_is_fenced_by_its_own_length() -> None:
    """Issue 42: the settings say 30 s, but the database granted this lease 5 s (the
    setting was lowered since the runner read it): the self-fence counts 5 s."""
    service = _service(30)
    short = _execution(1, renewed_s_ago=4.5)
    short.lease_s = 5.0
    long = _execution(2, renewed_s_ago=4.5)  # no answer yet: the setting stands
    service.executions = {short.claim.job_id: short, long.claim.job_id: long}
    await service._self_fence_once()
    assert short.stop_reason == "self_fenced"
    assert long.stop_reason is None


def test_renewal_is_due_at_a_third_of_each_lease_s_own_length() -> None:
    service = _service(30)
    now = time.monotonic()
    assert service._renew_by(now) == now + 10  # nothing held: the runner's beat
    ex = _execution(1, renewed_s_ago=0)
    ex.renewed_at, ex.lease_s = now, 6.0
    service.executions = {ex.claim.job_id: ex}
    assert service._renew_by(now) == now + 2  # its own third, not the setting's
    ex.lease_s = 0.0  # a retried claim answered with nothing left: at once, within limits
    assert service._renew_by(now) == now + 0.2
    ex.lease_s = 300.0  # a longer lease is renewed at the runner's beat anyway
    assert service._renew_by(now) == now + 10
