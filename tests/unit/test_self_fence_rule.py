"""Which runs the self-fence stops: those whose process still runs, never one that has
ended and only waits for its outcome to be written (seen in the failover test: the
finished run was recorded as fenced, and could have been handed back and run again)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from fleetq.core.models import JobId
from fleetq.runner.execution import Execution
from fleetq.runner.leases import LeaseHooks, Leases
from tests.unit.test_job_env import _claim


def _execution(job: int, *, renewed_s_ago: float) -> Execution:
    return Execution(
        claim=_claim(job_id=job, lease_version=1),
        lane="checks",
        renewed_at=time.monotonic() - renewed_s_ago,
    )


def leases(executions: list[Execution], lease_s: int, driver: object = None) -> Leases:
    """A runner's `Leases` over these executions, the settings at `lease_s`."""

    async def nothing() -> None:
        return None

    kept = Leases(
        driver=driver,  # type: ignore[arg-type]
        runner="n/r",  # type: ignore[arg-type]
        # the log line of a fence names the pool's use: counters only, no database here
        pool=SimpleNamespace(  # type: ignore[arg-type]
            get_size=lambda: 1, get_idle_size=lambda: 1, get_max_size=lambda: 6
        ),
        executions={JobId(ex.claim.job_id): ex for ex in executions},
        superseded=list,
        done=asyncio.Event(),
        hooks=LeaseHooks(wake_lanes=lambda: None, follow_state=nothing, reread_config=lambda: None),
    )
    kept.lease_seconds = kept.offline_after_seconds = lease_s
    return kept


async def test_a_run_that_ended_is_not_fenced_while_its_outcome_waits() -> None:
    running, ended = _execution(1, renewed_s_ago=60), _execution(2, renewed_s_ago=60)
    ended.ended_monotonic = time.monotonic() - 30  # exited; its outcome write is retried
    await leases([running, ended], 10).self_fence_once()
    assert running.stop_reason == "self_fenced" and running.stop.is_set()
    assert ended.stop_reason is None and not ended.stop.is_set()


async def test_a_lease_granted_shorter_than_the_setting_is_fenced_by_its_own_length() -> None:
    """Issue 42: the settings say 30 s, but the database granted this lease 5 s (the
    setting was lowered since the runner read it): the self-fence counts 5 s."""
    short = _execution(1, renewed_s_ago=4.5)
    short.lease_s = 5.0
    long = _execution(2, renewed_s_ago=4.5)  # no answer yet: the setting stands
    await leases([short, long], 30).self_fence_once()
    assert short.stop_reason == "self_fenced"
    assert long.stop_reason is None


def test_renewal_is_due_at_a_third_of_each_lease_s_own_length() -> None:
    now = time.monotonic()
    assert leases([], 30).renew_by(now) == now + 10  # nothing held: the runner's beat
    ex = _execution(1, renewed_s_ago=0)
    ex.renewed_at, ex.lease_s = now, 6.0
    kept = leases([ex], 30)
    assert kept.renew_by(now) == now + 2  # its own third, not the setting's
    ex.lease_s = 0.0  # a retried claim answered with nothing left: at once, within limits
    assert kept.renew_by(now) == now + 0.2
    ex.lease_s = 300.0  # a longer lease is renewed at the runner's beat anyway
    assert kept.renew_by(now) == now + 10
