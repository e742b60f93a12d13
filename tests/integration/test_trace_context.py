"""Trace context (W3C traceparent) given at submit is stored on the job, returned by the
claim so the runner hands it to the job as TRACEPARENT, and recorded in the submit event;
a malformed one is refused, by the API and by the database itself."""

from __future__ import annotations

import psycopg
import pytest

from fleetq.core import leasing, producer, readers
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver
from fleetq.core.errors import InvalidInput
from tests import fleet
from tests.fleet import SHA

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(autouse=True)
def _fleet(sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)


async def test_a_trace_travels_from_submit_to_the_claim(driver: Driver) -> None:
    runner = await fleet.runner(driver)
    answer = await producer.submit(
        driver,
        project="tools",
        operation="lint",
        commit=SHA,
        submitted_by="a",
        traceparent=TRACE.upper(),
    )
    job = await readers.job(driver, answer.job_id)
    assert job.traceparent == TRACE  # lower-cased, as the standard writes it
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    assert claim.traceparent == TRACE
    (submitted,) = [e for e in await readers.events(driver, job_id=job.id) if e.kind == "submitted"]
    assert submitted.detail["traceparent"] == TRACE
    plain = await producer.submit(
        driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
    )
    assert (await readers.job(driver, plain.job_id)).traceparent is None


@pytest.mark.parametrize(
    "bad",
    [
        "not-a-trace",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero parent id
    ],
)
async def test_a_malformed_trace_is_refused(driver: Driver, bad: str) -> None:
    with pytest.raises(InvalidInput, match="traceparent"):
        await producer.submit(
            driver,
            project="tools",
            operation="lint",
            commit=SHA,
            submitted_by="a",
            traceparent=bad,
        )


def test_the_database_refuses_a_malformed_trace_too(sync_conn: SyncConnection) -> None:
    """As bad input (FQ003, exit 65), as the API does: it was a check violation (23514)."""
    with pytest.raises(psycopg.Error) as refused:
        sync_conn.execute(
            "SELECT * FROM fleetq.submit('tools', 'lint', $1, NULL, NULL, NULL, 'a', '{}', "
            "NULL, 'trace me')",
            [SHA],
        )
    assert refused.value.sqlstate == "FQ003", refused.value
    # the table's own check stays, for a writer that is not submit
    job = sync_conn.execute(
        "SELECT job_id FROM fleetq.submit('tools', 'lint', $1, NULL, NULL, NULL, 'a', '{}', "
        "NULL, NULL)",
        [SHA],
    ).fetchone()
    assert job is not None
    with pytest.raises(psycopg.errors.CheckViolation):
        sync_conn.execute("UPDATE fleetq.jobs SET traceparent = 'x' WHERE id = $1", [job[0]])
