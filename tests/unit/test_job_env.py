"""What a job's process is told: its job, token, run, commit, and its trace context."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from fleetq.core.models import Claim
from fleetq.runner.carrying import _job_env
from fleetq.runner.execution import Execution

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _claim(**extra: Any) -> Claim:
    return Claim.model_validate(
        {
            "job_id": 7,
            "lease_version": 2,
            "lease_expires_at": datetime.now(UTC),
            "project": "tools",
            "operation": "lint",
            "commit_sha": "a" * 40,
            "requested_node": None,
            "payload": {},
            "task_id": None,
            "timeout_s": 60,
            "memory_mb": 0,
            "cpu_millis": 0,
            "priority_class": 2,
            "reassign_count": 0,
            "lost_count": 0,
            **extra,
        }
    )


def test_the_job_gets_its_trace_as_traceparent() -> None:
    kit: Any = SimpleNamespace(node="node-a")
    run = uuid.uuid4()
    env = _job_env(Execution(claim=_claim(traceparent=TRACE), lane="checks", known_run_id=run), kit)
    assert env["TRACEPARENT"] == TRACE
    assert (env["FLEETQ_JOB_ID"], env["FLEETQ_FENCING_TOKEN"], env["FLEETQ_RUN_ID"]) == (
        "7",
        "2",
        str(run),
    )
    assert "TRACEPARENT" not in _job_env(
        Execution(claim=_claim(), lane="checks", known_run_id=run), kit
    )
