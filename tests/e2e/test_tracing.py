"""OpenTelemetry spans from a real runner (issue 17): claim → stage → run → outcome, in
the trace the job was submitted with, and the job continuing the runner's run span."""

from __future__ import annotations

import json
import re
from typing import Any

from fleetq.core import producer
from fleetq.core.db import connect
from tests.e2e.conftest import Repo, StartRunner, job_state, stop, wait_until

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
TRACE = f"00-{TRACE_ID}-{PARENT}-01"


def _spans(text: str) -> list[dict[str, Any]]:
    """The console exporter's spans (indented JSON objects) among the runner's log lines."""
    decoder = json.JSONDecoder()
    return [
        decoder.raw_decode(text, m.start())[0] for m in re.finditer(r'^\{\n\s+"name"', text, re.M)
    ]


def _run(fleet_dsn: str, repo: Repo) -> tuple[int, str]:
    with connect(fleet_dsn, autocommit=True) as conn:
        job = producer.submit_in_transaction(
            conn,
            project="repo",
            operation="trace",
            commit=repo.head,
            submitted_by="tests",
            traceparent=TRACE,
        ).job_id
        wait_until(lambda: job_state(conn, job) in ("succeeded", "failed"), what="the job")
        row = conn.execute(
            "SELECT log_tail FROM fleetq.verdicts WHERE job_id = $1", [job]
        ).fetchone()
    assert row is not None
    found = re.search(r"TP=\[(\S*)\]", str(row[0]))
    assert found, row
    return job, found.group(1)


def test_without_a_tracer_the_job_gets_the_submitted_context(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    runner = start_runner(env={"OTEL_TRACES_EXPORTER": ""})
    _, handed = _run(fleet_dsn, repo)
    assert handed == TRACE
    assert "OpenTelemetry spans on" not in runner.output()


def test_spans_continue_the_submitted_trace_and_the_job_continues_the_run(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner
) -> None:
    runner = start_runner(env={"OTEL_TRACES_EXPORTER": "console"})
    job, handed = _run(fleet_dsn, repo)
    stop(runner)  # flushes the exporter
    spans = {s["name"]: s for s in _spans(runner.output())}
    job_span = spans["fleetq.job repo/trace"]
    run_span, stage_span = spans["fleetq.run"], spans["fleetq.stage"]
    assert job_span["context"]["trace_id"] == f"0x{TRACE_ID}"
    assert job_span["parent_id"] == f"0x{PARENT}"  # a child of the submitter's span
    assert job_span["attributes"]["fleetq.job_id"] == job
    assert job_span["attributes"]["fleetq.outcome"] == "succeeded"
    assert job_span["status"]["status_code"] == "OK"
    assert [e["name"] for e in job_span["events"]] == ["started"]
    for child in (run_span, stage_span):
        assert child["parent_id"] == job_span["context"]["span_id"]
    # the job continues the run span: same trace, the run span as its parent
    _, trace_id, parent, _ = handed.split("-")
    assert (trace_id, f"0x{parent}") == (TRACE_ID, run_span["context"]["span_id"])
