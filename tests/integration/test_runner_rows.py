"""A runner's own rows: registering again keeps the lanes it still holds jobs in, a
runner back from offline is active from that moment, a state no one may set is refused,
forgetting is done once, and a live runner is not forgotten (the refusal says since
when it was heard from)."""

from __future__ import annotations

import re
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from fleetq.core import fleet as fleet_api
from fleetq.core import leasing, producer, removal
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import Driver
from fleetq.core.errors import InvalidInput, RefusedNow
from fleetq.core.models import Registration, RunnerId, RunnerState, StartReport
from tests import fleet, stamps
from tests.fleet import SHA
from tests.locks import blocked_or_done, wait_for


@pytest.fixture(autouse=True)
def _fleet(sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)


def _registration(lanes: dict[str, int]) -> Registration:
    return Registration(
        node="node-a", name="r1", capabilities=[], memory_mb=16384, cpu_millis=8000, lanes=lanes
    )


def _lanes(conn: SyncConnection, runner: RunnerId) -> dict[str, tuple[int, int]]:
    rows = conn.execute(
        "SELECT lane, slots, slots_used FROM fleetq.runner_lanes WHERE runner_id = $1", [runner]
    ).fetchall()
    return {lane: (slots, used) for lane, slots, used in rows}


def _now(conn: SyncConnection) -> datetime:
    (now,) = conn.execute("SELECT clock_timestamp()").fetchone() or (None,)
    assert isinstance(now, datetime)
    return now


async def test_registering_again_keeps_a_lane_it_still_holds_a_job_in(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """Restarted without the lane it ran a job in, the runner keeps that lane's row (and
    its count of the job) until the job ends; a lane it holds nothing in goes."""
    runner = await fleet_api.register(driver, _registration({"checks": 4, "control": 1}))
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="a")
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    await fleet_api.register(driver, _registration({"control": 2}))
    assert _lanes(sync_conn, runner) == {"checks": (4, 1), "control": (2, 0)}
    assert claim.job_id


async def test_a_runner_back_from_offline_is_active_from_that_moment(
    driver: Driver, sync_conn: SyncConnection, db_dsn: str
) -> None:
    runner = await fleet_api.register(driver, _registration({"checks": 4}))
    await fleet_api.set_state(
        driver, runner=runner, state=RunnerState.OFFLINE, reason="stopped", actor="r1"
    )
    before = _now(sync_conn)
    await fleet_api.register(driver, _registration({"checks": 4}))
    (state, changed) = sync_conn.execute(
        "SELECT state, state_changed_at FROM fleetq.runners WHERE id = $1", [runner]
    ).fetchone() or (None, None)
    assert state == "active"
    assert before <= changed <= _now(sync_conn)
    assert not stamps.future_stamps(db_dsn)


@pytest.mark.parametrize("state", ["drained", "lost"])
async def test_a_state_no_one_may_set_is_refused(
    driver: Driver, sync_conn: SyncConnection, state: str
) -> None:
    """'drained' is a state a drain reaches, never one to set; the rule is the
    function's, not only the Python enum's."""
    runner = await fleet_api.register(driver, _registration({"checks": 4}))
    with pytest.raises((InvalidInput,)):
        await driver.fetch(
            "SELECT * FROM fleetq.set_runner_state($1, $2, 'x', 'ops')", runner, state
        )
    (now,) = sync_conn.execute(
        "SELECT state FROM fleetq.runners WHERE id = $1", [runner]
    ).fetchone() or (None,)
    assert now == "active"


async def test_a_runner_is_forgotten_once(
    driver: Driver, sync_conn: SyncConnection, db_dsn: str
) -> None:
    runner = await fleet_api.register(driver, _registration({"checks": 4}))
    await fleet_api.set_state(
        driver, runner=runner, state=RunnerState.OFFLINE, reason="stopped", actor="r1"
    )
    first = await removal.forget_runner(driver, runner=runner, actor="ops")
    assert not stamps.future_stamps(db_dsn)
    again = await removal.forget_runner(driver, runner=runner, actor="someone else")
    assert again == first
    rows = sync_conn.execute(
        "SELECT forgotten_by, (SELECT count(*) FROM fleetq.events "
        "WHERE kind = 'runner_forgotten' AND runner_id = $1) FROM fleetq.runners WHERE id = $1",
        [runner],
    ).fetchall()
    assert rows == [("ops", 1)]


async def test_a_live_runner_is_not_forgotten_and_the_refusal_says_since_when(
    driver: Driver,
) -> None:
    runner = await fleet_api.register(driver, _registration({"checks": 4}))
    with pytest.raises(RefusedNow) as refused:
        await removal.forget_runner(driver, runner=runner, actor="ops")
    # heard from a moment ago, by the database's clock (date_trunc to the second)
    assert re.search(r"heard from 00:00:0\d ago", str(refused.value)), str(refused.value)


@pytest.mark.parametrize("name", ["r\x07", "", "r" * 257])
async def test_a_runner_name_the_database_would_not_show_is_refused_there(
    driver: Driver, sync_conn: SyncConnection, name: str
) -> None:
    """The rule on names (no control characters, 1 to 256 bytes) is the database's,
    not only the client's: a registration that reaches the SQL with a bad one is
    refused there, and no runner row is written."""
    with pytest.raises(InvalidInput):
        await driver.fetch(
            "SELECT * FROM fleetq.register_runner('node-a', $1, '{}', 1024, 1000, "
            "'{checks}', '{1}', '', NULL)",
            name,
        )
    assert sync_conn.execute("SELECT count(*) FROM fleetq.runners").fetchone() == (0,)


async def test_a_draining_runner_with_nothing_left_is_drained_by_its_next_beat(
    driver: Driver, sync_conn: SyncConnection, db_dsn: str
) -> None:
    """Only its own jobs keep a draining runner draining: another runner's held job does
    not, and the moment it is drained is the beat's."""
    runner = await fleet_api.register(driver, _registration({"checks": 4}))
    other = await fleet.runner(driver, "r2", node="node-b")
    for who in (runner, other):
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
        )
        assert len(await leasing.claim(driver, runner=who, lane="checks", limit=1)) == 1
    await fleet_api.set_state(
        driver, runner=runner, state=RunnerState.DRAINING, reason="upgrade", actor="ops"
    )
    (mine,) = sync_conn.execute(
        "SELECT id, lease_version FROM fleetq.jobs WHERE lease_owner = $1", [runner]
    ).fetchall()
    await leasing.release(driver, runner=runner, job_id=mine[0], token=mine[1], reason="draining")
    before = _now(sync_conn)
    await leasing.heartbeat(driver, runner=runner, leases=[])
    (state, changed) = sync_conn.execute(
        "SELECT state, state_changed_at FROM fleetq.runners WHERE id = $1", [runner]
    ).fetchone() or (None, None)
    assert state == "drained"
    assert before <= changed <= _now(sync_conn)
    assert not stamps.future_stamps(db_dsn)


async def test_what_a_runner_holds_is_aged_from_its_claim_by_the_database(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """The collection pass on start-up reads how long each held job has been held:
    seconds since its claim on the database's clock, never a time to come."""
    runner = await fleet_api.register(driver, _registration({"checks": 4}))
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="a")
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    rows = sync_conn.execute(
        "SELECT job_id, held_s FROM fleetq.runner_held($1)", [runner]
    ).fetchall()
    assert [r[0] for r in rows] == [claim.job_id]
    assert 0 <= rows[0][1] < 60, rows


async def test_a_runner_s_note_is_bounded(driver: Driver, sync_conn: SyncConnection) -> None:
    """A runner notes an adoption it refused, with a detail of at most 8192 bytes: a
    larger one is refused, and nothing is logged."""
    runner = await fleet_api.register(driver, _registration({"checks": 4}))
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="a")
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    note = "SELECT fleetq.runner_note('adoption_refused', $1, $2, $3, $4::text::jsonb)"
    with pytest.raises(InvalidInput, match="at most 8192 bytes"):
        await driver.fetch(
            note, claim.job_id, runner, claim.lease_version, '{"why": "' + "x" * 9000 + '"}'
        )
    await driver.fetch(note, claim.job_id, runner, claim.lease_version, '{"why": "pid reused"}')
    kinds = sync_conn.execute(
        "SELECT count(*) FROM fleetq.events WHERE kind = 'adoption_refused'"
    ).fetchone()
    assert kinds == (1,)


@pytest.mark.parametrize("skew", [timedelta(days=1), -timedelta(days=1)], ids=["ahead", "behind"])
async def test_a_launch_is_dated_between_its_claim_and_its_start_report(
    driver: Driver, sync_conn: SyncConnection, skew: timedelta
) -> None:
    """The process start a node reports comes from its own clock (psutil, to the
    second): the database dates the launch within its claim and its start report, so a
    node's clock a day off moves no overlap window."""
    runner = await fleet_api.register(driver, _registration({"checks": 4}))
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="a")
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    start = StartReport(
        job_id=claim.job_id,
        lease_version=claim.lease_version,
        node="node-a",
        run_id=uuid.uuid4(),
        pid=4242,
        process_started_at=datetime.now(UTC) + skew,
    )
    await leasing.report_start(driver, runner=runner, start=start)
    row = sync_conn.execute(
        "SELECT j.claimed_at <= e.launched_at AND e.launched_at <= e.start_reported_at "
        "FROM fleetq.executions e JOIN fleetq.jobs j ON j.id = e.job_id WHERE e.job_id = $1",
        [claim.job_id],
    ).fetchone()
    assert row == (True,)


async def test_a_drain_decided_while_a_claim_is_in_flight_waits_for_it(
    driver: Driver, sync_conn: SyncConnection, db_dsn: str
) -> None:
    """A drain asks whether its runner holds anything; a claim of that runner still in
    flight holds the runner's row, so the drain waits for it and then sees its job:
    'draining', not 'drained' with a job it will run (mutant: the drain's lock)."""
    runner = await fleet_api.register(driver, _registration({"checks": 4}))
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="a")
    answer: list[str] = []
    with connect(db_dsn) as claimer, connect(db_dsn, autocommit=True) as operator:
        claimer.execute("SELECT * FROM fleetq.claim($1, 'checks', 1, gen_random_uuid())", [runner])
        (pid,) = operator.execute("SELECT pg_backend_pid()").fetchone() or (0,)

        def drain() -> None:
            row = operator.execute(
                "SELECT state FROM fleetq.set_runner_state($1, 'draining', 'upgrade', 'ops')",
                [runner],
            ).fetchone()
            answer.append(str(row[0]) if row else "")

        thread = threading.Thread(target=drain)
        thread.start()
        wait_for(lambda: blocked_or_done(db_dsn, int(pid), thread), "the drain to wait")
        claimer.commit()
        thread.join(timeout=30)
    assert answer == ["draining"]
