"""An execution's end stays the one its runner saw (CI's combined fault scenario: a run
that had exited while its runner was cut off read as a 0.5 s "measured" overlap, its end
stamped 5 s late by the error path that ran after it)."""

from __future__ import annotations

import asyncio
import time
from typing import cast

from fleetq.runner.execution import Execution, Toolkit
from fleetq.runner.runs import RunHooks, Runs
from tests.unit.test_job_env import _claim


async def test_an_error_after_the_run_ended_keeps_the_end_it_was_seen_at() -> None:
    runs = Runs(
        kit=cast(Toolkit, None),  # not reached: the stop is recorded by its own path
        executions={},
        stop=asyncio.Event(),
        hooks=cast(RunHooks, None),
    )
    ex = Execution(claim=_claim(), lane="checks", renewed_at=time.monotonic(), lease_s=4.0)
    seen = time.monotonic() - 5.0  # exited 5 s ago; its outcome waited on a cut-off link
    ex.ended_monotonic = seen
    ex.request_stop("self_fenced")
    await runs._runner_error(ex, RuntimeError("the output's last write broke"))
    assert ex.end_seen == seen
