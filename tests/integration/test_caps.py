"""Fleet-wide caps (`max_running` per lane and per project): never more of a lane's or a
project's jobs hold capacity at once than its cap, whatever the runners' slots; counted
under the claim's lock, so two runners claiming at once cannot both fill the last room;
a project at its cap does not hold up other projects in the lane; explain says so."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest

from fleetq.core import config, eligibility, leasing, producer, queries
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import Driver
from fleetq.core.models import JobId, Outcome, OutcomeReport
from tests import fleet
from tests.fleet import SHA
from tests.locks import blocked_or_done, wait_for


@pytest.fixture(autouse=True)
def _fleet(sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)


def _cap(conn: SyncConnection, table: str, name: str, cap: int | None) -> None:
    conn.execute(
        f"UPDATE fleetq.{table} SET max_running = $1 WHERE name = $2".encode(), [cap, name]
    )


async def _submit(driver: Driver, project: str = "tools", operation: str = "lint") -> JobId:
    answer = await producer.submit(
        driver, project=project, operation=operation, commit=SHA, submitted_by="a"
    )
    return answer.job_id


async def test_a_lane_cap_holds_across_runners(driver: Driver, sync_conn: SyncConnection) -> None:
    _cap(sync_conn, "lanes", "checks", 2)
    one = await fleet.runner(driver)
    other = await fleet.runner(driver, "r2", node="node-b")
    jobs = [await _submit(driver) for _ in range(4)]
    first = await leasing.claim(driver, runner=one, lane="checks", limit=5)
    assert [c.job_id for c in first] == jobs[:2]
    assert await leasing.claim(driver, runner=other, lane="checks", limit=5) == []
    explained = await eligibility.explain(driver, jobs[2])
    assert explained.at_cap == ["lane checks at its cap (2/2)"]
    assert explained.summary().startswith("lane checks at its cap (2/2): no runner takes it")
    report = OutcomeReport(
        job_id=first[0].job_id,
        lease_version=first[0].lease_version,
        outcome=Outcome.SUCCEEDED,
        exit_code=0,
    )
    await leasing.complete(driver, runner=one, outcome=report)
    (second,) = await leasing.claim(driver, runner=other, lane="checks", limit=5)
    assert second.job_id == jobs[2]


async def test_a_project_at_its_cap_does_not_hold_up_the_others(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    _cap(sync_conn, "projects", "tools", 1)
    runner = await fleet.runner(driver, lanes={"checks": 10, "control": 1})
    tools = [await _submit(driver) for _ in range(3)]
    webapp = [await _submit(driver, "webapp", "unit") for _ in range(2)]
    claims = await leasing.claim(driver, runner=runner, lane="checks", limit=10)
    taken = sorted(c.job_id for c in claims)
    assert taken == sorted([*webapp, tools[0]])
    explained = await eligibility.explain(driver, tools[1])
    assert explained.at_cap == ["project tools at its cap (1/1)"]


async def test_a_pending_stop_still_counts(driver: Driver, sync_conn: SyncConnection) -> None:
    """A cancelled job's process runs until its runner confirms the stop: it still
    holds its place under the cap."""
    _cap(sync_conn, "lanes", "checks", 1)
    runner = await fleet.runner(driver)
    running, waiting = await _submit(driver), await _submit(driver)
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=5)
    await producer.cancel(driver, job_id=running, actor="ops")
    assert await leasing.claim(driver, runner=runner, lane="checks", limit=5) == []
    await leasing.confirm_stop(
        driver,
        runner=runner,
        job_id=running,
        token=claim.lease_version,
        signal=15,
        reason="cancelled",
    )
    (after,) = await leasing.claim(driver, runner=runner, lane="checks", limit=5)
    assert after.job_id == waiting


@pytest.mark.parametrize(("table", "name"), [("lanes", "checks"), ("projects", "tools")])
async def test_two_runners_claiming_at_once_never_exceed_the_cap(
    driver: Driver, sync_conn: SyncConnection, db_dsn: str, table: str, name: str
) -> None:
    """The first claim is left uncommitted: the second waits on the lane's (or the
    project's) row, then counts the first's jobs. Without the lock both would see room
    for three (issue 43, finding 3: four runners, project cap 1, four jobs reserved)."""
    _cap(sync_conn, table, name, 3)
    one = await fleet.runner(driver)
    other = await fleet.runner(driver, "r2", node="node-b")
    for _ in range(6):
        await _submit(driver)
    taken: list[int] = []
    with connect(db_dsn) as first, connect(db_dsn) as second:
        taken += [
            r[0]
            for r in first.execute(
                queries.sql("lease_claim"), [one, "checks", 3, uuid.uuid4()]
            ).fetchall()
        ]
        (pid,) = second.execute("SELECT pg_backend_pid()").fetchone() or ()

        def claim_too() -> None:
            taken.extend(
                r[0]
                for r in second.execute(
                    queries.sql("lease_claim"), [other, "checks", 3, uuid.uuid4()]
                ).fetchall()
            )
            second.commit()

        worker = threading.Thread(target=claim_too)
        worker.start()
        wait_for(lambda: blocked_or_done(db_dsn, pid, worker), "the second claim to wait")
        first.commit()
        worker.join(timeout=10)
        assert not worker.is_alive()
    assert len(taken) == 3


def test_caps_are_configured_in_the_fleet_file(sync_conn: SyncConnection, tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[lanes.checks]\nmax_running = 8\n\n[projects.tools]\nrepository = "/srv/git/tools.git"\n'
        "max_running = 2\n"
    )
    config.apply(sync_conn, config.load(path), source=path)
    caps = sync_conn.execute(
        "SELECT (SELECT max_running FROM fleetq.lanes WHERE name = 'checks'), "
        "(SELECT max_running FROM fleetq.projects WHERE name = 'tools')"
    ).fetchone()
    assert caps == (8, 2)


async def test_room_freed_under_a_cap_wakes_the_lane(
    driver: Driver, sync_conn: SyncConnection, db_dsn: str
) -> None:
    """An idle runner's polls back off (up to --poll-max), so the outcome that frees room
    under a cap must wake the lane's runners itself; without a cap, it need not."""
    one = await fleet.runner(driver)

    async def outcome_wakes_checks() -> bool:
        (claimed,) = await leasing.claim(driver, runner=one, lane="checks", limit=1)
        with fleet.wakeups(db_dsn) as woken:
            await leasing.complete(
                driver,
                runner=one,
                outcome=OutcomeReport(
                    job_id=claimed.job_id,
                    lease_version=claimed.lease_version,
                    outcome=Outcome.SUCCEEDED,
                    exit_code=0,
                ),
            )
        return "checks" in woken

    await _submit(driver)
    assert not await outcome_wakes_checks()
    _cap(sync_conn, "lanes", "checks", 3)
    await _submit(driver)
    assert await outcome_wakes_checks()


def test_a_cap_raised_by_apply_wakes_the_lanes(
    sync_conn: SyncConnection, db_dsn: str, tmp_path: Path
) -> None:
    """A job held back by a cap was announced at its submit, and nothing announces it
    again: raising the cap with `fleetq apply` must wake the lanes itself, or the job
    waits for a runner's poll (up to --poll-max). An apply that changes nothing wakes
    nobody."""
    path = tmp_path / "fleet.toml"

    def apply_cap(cap: int) -> list[str]:
        path.write_text(f"[lanes.checks]\nmax_running = {cap}\n")
        with fleet.wakeups(db_dsn) as woken:
            config.apply(sync_conn, config.load(path), source=path)
        return woken

    assert "checks" in apply_cap(1)  # the lane row changed (no cap before)
    assert apply_cap(1) == []  # nothing changed: no wake-up
    assert "checks" in apply_cap(2)
