"""A claim's two stages (fleetq.claim_unchecked): stage one walks the lane's queued jobs
on what the runner's rows say, unlocked, and holds the ones it picks; stage two
(fleetq.claim_take) takes of those, under the runner's lock, only what still qualifies.
Each stage filters on its own: stage one so that jobs no one may take now do not fill
the walk's limit (a project at its cap would hide the others behind it), stage two
because what stage one read may have changed before the lock (the runner paused, its
room taken by its claim in another lane, the cap filled by another runner)."""

from __future__ import annotations

import pytest

from fleetq.core import leasing, producer
from fleetq.core.db import SyncConnection
from fleetq.core.driver import Driver
from fleetq.core.models import JobId
from tests import fleet
from tests.fleet import SHA

# stage two as claim_unchecked calls it, with the runner's state and room given here
TAKE = (
    "SELECT job_id FROM fleetq.claim_take($1, 'checks', 8, gen_random_uuid(), $2, 'node-a', "
    "$3, 'active', false, 16384, 8000, 4, 0, NULL, NULL, NULL, $4, interval '30 seconds')"
)


@pytest.fixture(autouse=True)
def _fleet(sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)


async def _submit(driver: Driver, project: str, operation: str) -> JobId:
    answer = await producer.submit(
        driver, project=project, operation=operation, commit=SHA, submitted_by="a"
    )
    return answer.job_id


def _take(
    conn: SyncConnection, runner: str, held: list[int], caps: list[str], full: list[str] | None
) -> list[int]:
    return [r[0] for r in conn.execute(TAKE.encode(), [runner, held, caps, full]).fetchall()]


async def test_a_project_at_its_cap_does_not_fill_the_walk_ahead_of_others(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """Older jobs of a project at its cap ahead of a newer one of another project, and a
    runner with two free slots: the walk skips the full project's jobs, so the claim
    takes the other one (mutant claim-walk-drops-full-projects)."""
    # webapp, a release gate, comes first in the lane's order
    sync_conn.execute("UPDATE fleetq.projects SET max_running = 1 WHERE name = 'webapp'")
    runner = await fleet.runner(driver, lanes={"checks": 3, "control": 1})
    first = await _submit(driver, "webapp", "unit")
    claimed = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    assert [c.job_id for c in claimed] == [first]
    for _ in range(3):
        await _submit(driver, "webapp", "unit")
    other = await _submit(driver, "tools", "lint")
    taken = await leasing.claim(driver, runner=runner, lane="checks", limit=5)
    assert [c.job_id for c in taken] == [other]


async def test_stage_two_takes_only_what_still_qualifies_under_the_lock(
    driver: Driver, sync_conn: SyncConnection
) -> None:
    """Held jobs that no longer qualify when the runner's row is locked are left: one the
    runner lacks a capability for, one whose project filled up meanwhile; the same call
    with the facts that let them takes them (mutants claim-take-drops-the-eligibility-recheck,
    claim-take-drops-the-full-projects-recheck)."""
    runner = await fleet.runner(driver, capabilities=("browser",))
    browser = await _submit(driver, "webapp", "browser")
    lint = await _submit(driver, "tools", "lint")
    assert _take(sync_conn, runner, [browser], [], None) == []
    assert _take(sync_conn, runner, [lint], [], ["tools"]) == []
    assert _take(sync_conn, runner, [browser, lint], ["browser"], None) == [browser, lint]
