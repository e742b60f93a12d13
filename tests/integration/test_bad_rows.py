"""Rows that submit no longer accepts, read by every reader (issue 41, finding 3).

A payload that is not a JSON object made the claim raise (every runner of the lane
exited 70), `fleetq jobs` and `fleetq explain` exit 70 and the console's reads fail.
Such rows were written before submit refused them, so they are made here as an
administrator, straight in SQL, after an ordinary submit.
"""

from __future__ import annotations

import json
import uuid

import pytest

from fleetq.core import jobpages, leasing, producer, readers, views
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver
from fleetq.core.models import Claim, JobId, JobState, Outcome, OutcomeReport, WriteStatus
from tests import fleet
from tests.fleet import SHA
from tests.integration.conftest import Cli

# stored as jsonb -> read back as Python
BAD_PAYLOADS = {"[1,2,3]": [1, 2, 3], '"text"': "text", "null": None, "42": 42}
KINDS = {"[1,2,3]": "an array", '"text"': "a string", "null": "null", "42": "a number"}


async def _submit(driver: Driver, payload: str | None = None) -> JobId:
    job = (
        await producer.submit(
            driver,
            project="tools",
            operation="lint",
            commit=SHA,
            submitted_by="alice",
            payload={"n": 1},
        )
    ).job_id
    if payload is not None:
        await _store(driver, job, payload)
    return job


async def _store(driver: Driver, job: int, payload: str) -> None:
    await driver.fetch(
        "UPDATE fleetq.jobs SET payload = $2::text::jsonb WHERE id = $1", job, payload
    )


async def _verdict(driver: Driver, job: int) -> tuple[str, str]:
    (row,) = await driver.fetch(
        "SELECT v.verdict, v.reason, j.state FROM fleetq.verdicts v"
        " JOIN fleetq.jobs j ON j.id = v.job_id WHERE v.job_id = $1",
        job,
    )
    assert row["state"] == row["verdict"]
    return str(row["verdict"]), str(row["reason"])


@pytest.fixture(autouse=True)
def _fleet(sync_conn: SyncConnection, request: pytest.FixtureRequest) -> None:
    if "cli" not in request.fixturenames:  # which makes the fleet itself
        fleet.operations(sync_conn)


@pytest.mark.parametrize("payload", list(BAD_PAYLOADS))
async def test_a_claim_refuses_the_bad_row_and_returns_the_rest(
    driver: Driver, payload: str
) -> None:
    runner = await fleet.runner(driver)
    before = await _submit(driver)
    bad = await _submit(driver, payload)
    after = await _submit(driver)
    claim_id = uuid.uuid4()
    claims = await leasing.claim(driver, runner=runner, lane="checks", limit=3, claim_id=claim_id)
    assert [c.job_id for c in claims] == [before, after]
    assert [(u.job_id, u.lease_version) for u in claims.refused] == [(bad, 1)]
    assert claims.taken == 3
    reason = f"unusable job: payload must be a JSON object, not {KINDS[payload]}"
    assert claims.refused[0].reason == reason
    assert await _verdict(driver, bad) == ("refused", reason)
    # a retry of the same claim (its reply lost) gets back what it still holds: the
    # refusal had committed
    again = await leasing.claim(driver, runner=runner, lane="checks", limit=3, claim_id=claim_id)
    assert [c.job_id for c in again] == [before, after] and again.refused == []
    # its room is given back: the runner holds the two it can run, nothing more
    (held,) = await driver.fetch(
        "SELECT slots_used FROM fleetq.runner_lanes WHERE runner_id = $1 AND lane = 'checks'",
        runner,
    )
    assert held["slots_used"] == 2


async def test_an_outcome_batch_refuses_the_bad_row_it_claims(driver: Driver) -> None:
    """complete_and_claim: the outcome commits, the next job claimed with it is
    refused, the one after it is returned."""
    runner = await fleet.runner(driver, lanes={"checks": 2})
    held = await _submit(driver)
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    assert claim.job_id == held
    bad, good = await _submit(driver, "[1,2,3]"), await _submit(driver)
    answers, claims = await leasing.complete_and_claim(
        driver,
        runner=runner,
        outcomes=[
            OutcomeReport(
                job_id=claim.job_id,
                lease_version=claim.lease_version,
                outcome=Outcome.SUCCEEDED,
                exit_code=0,
            )
        ],
        lane="checks",
        limit=2,
        claim_id=uuid.uuid4(),
    )
    assert [a.status for a in answers] == [WriteStatus.OK]
    assert [c.job_id for c in claims] == [good]
    assert [u.job_id for u in claims.refused] == [bad]
    assert (await _verdict(driver, bad))[0] == "refused"


async def test_a_row_the_claim_model_rejects_elsewhere_is_refused_too(driver: Driver) -> None:
    """Not only the payload: any field the model does not accept names itself."""
    row = {"job_id": 7, "lease_version": 3, "payload": {}, "timeout_s": "soon"}
    parsed = leasing.parse_claim(row)
    assert not isinstance(parsed, Claim)
    assert (parsed.job_id, parsed.lease_version) == (7, 3)
    assert "timeout_s: Input should be a valid integer" in parsed.reason
    assert "soon" not in parsed.reason  # a value is never echoed (it may be a secret)


async def test_readers_show_a_payload_as_stored(driver: Driver) -> None:
    jobs = {await _submit(driver, text): value for text, value in BAD_PAYLOADS.items()}
    for job, value in jobs.items():
        assert (await readers.job(driver, job)).payload == value
    listed = {j.id: j.payload for j in await readers.jobs(driver)}
    assert listed == jobs
    page = await jobpages.job_page(driver, jobpages.JobFilter())
    assert {j.id: j.payload for j in page.jobs} == jobs
    assert set(page.waiting) == set(jobs)  # each queued job explained
    for job, value in jobs.items():
        assert (await views.job_detail(driver, job)).job.payload == value
    # and as a runner met it: refused, still read
    runner = await fleet.runner(driver)
    claims = await leasing.claim(driver, runner=runner, lane="checks", limit=10)
    assert sorted(u.job_id for u in claims.refused) == sorted(jobs)
    assert {j.state for j in await readers.jobs(driver)} == {JobState.REFUSED}


def test_the_cli_lists_and_explains_a_bad_row(cli: Cli, sync_conn: SyncConnection) -> None:
    ids = []
    for text in BAD_PAYLOADS:
        code, out, err = cli("submit", "tools", "lint", "--commit", SHA, "--json")
        assert code == 0, err
        job = json.loads(out)["job_id"]
        sync_conn.execute(
            "UPDATE fleetq.jobs SET payload = $2::text::jsonb WHERE id = $1", [job, text]
        )
        ids.append(job)
    code, out, err = cli("jobs")
    assert code == 0, err
    assert {int(line.split()[0]) for line in out.splitlines()[1:]} == set(ids)
    code, out, err = cli("jobs", "--json")
    assert code == 0, err
    assert [j["payload"] for j in json.loads(out)] == list(BAD_PAYLOADS.values())[::-1]
    for job in ids:
        code, out, err = cli("explain", str(job))
        assert code == 0 and "runners eligible" in out, err
        code, out, err = cli("explain", str(job), "--json")
        assert code == 0 and json.loads(out)["job_id"] == job, err
    code, out, err = cli("result", "tools", SHA, "--json")
    assert code == 2 and json.loads(out)[0]["job_id"] == ids[-1], err


UNREADABLE = {
    "a 5,000-digit number": """'{"a":1' || repeat('0', 5000) || '}'""",
    "arrays 1,100 deep": """'{"a":' || repeat('[', 1100) || repeat(']', 1100) || '}'""",
}


@pytest.mark.parametrize("shape", list(UNREADABLE))
def test_a_payload_python_cannot_read_is_shown_as_such(
    shape: str, cli: Cli, sync_conn: SyncConnection
) -> None:
    """Stored before submit refused it: `fleetq jobs` and `explain` exited 70 on it."""
    code, out, err = cli("submit", "tools", "lint", "--commit", SHA, "--json")
    assert code == 0, err
    job = json.loads(out)["job_id"]
    sync_conn.execute(
        f"UPDATE fleetq.jobs SET payload = ({UNREADABLE[shape]})::jsonb WHERE id = $1".encode(),
        [job],
    )
    code, out, err = cli("jobs", "--json")
    assert code == 0, err
    (listed,) = json.loads(out)
    assert listed["payload"].startswith("<JSON "), listed["payload"][:200]
    code, out, err = cli("explain", str(job))
    assert code == 0 and "runners eligible" in out, err
