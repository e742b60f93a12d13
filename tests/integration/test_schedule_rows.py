"""Each write to a schedule touches that schedule only: firing a tick, skipping ticks,
pausing and resuming one leave another's row and ticks exactly as they were, and date
what they write by the database's clock, checked at once (mutants fire-schedule-*,
skip-schedule-*, pause-schedule-*)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from fleetq.core.db import SyncConnection
from tests import fleet, stamps
from tests.fleet import SHA

FIRE = "SELECT job_id, fired FROM fleetq.fire_schedule($1, clock_timestamp() + $2::interval, $3)"


def _fire(conn: SyncConnection, name: str, ahead: str = "1 day") -> tuple[Any, bool]:
    row = conn.execute(FIRE, [name, ahead, SHA]).fetchone()
    assert row is not None
    return (row[0], bool(row[1]))


def _rows(conn: SyncConnection, name: str) -> list[Any]:
    schedule = conn.execute(
        "SELECT to_jsonb(s) FROM fleetq.schedules s WHERE s.name = $1", [name]
    ).fetchall()
    ticks = conn.execute(
        "SELECT to_jsonb(t) FROM fleetq.schedule_ticks t WHERE t.schedule = $1 ORDER BY t.tick",
        [name],
    ).fetchall()
    return [*schedule, *ticks]


def _fire_one(conn: SyncConnection) -> None:
    job, fired = _fire(conn, "nightly")
    assert fired
    (by,) = conn.execute(
        "SELECT submitted_by FROM fleetq.jobs WHERE id = $1", [job]
    ).fetchone() or (None,)
    assert by == "schedule:nightly"


def _skip(conn: SyncConnection) -> None:
    conn.execute("SELECT fleetq.skip_schedule('nightly', clock_timestamp() + interval '2 days')")


def _pause(conn: SyncConnection) -> None:
    conn.execute("SELECT fleetq.pause_schedule('nightly', true, 'maintenance', 'ops')")


def _resume(conn: SyncConnection) -> None:
    _pause(conn)
    conn.execute("SELECT fleetq.pause_schedule('nightly', false, '', 'ops')")
    (ahead,) = conn.execute(
        "SELECT last_tick > clock_timestamp() FROM fleetq.schedules WHERE name = 'nightly'"
    ).fetchone() or (None,)
    assert ahead is False, "resumed from a time to come: the ticks until then are lost"


ACTS: dict[str, Callable[[SyncConnection], None]] = {
    "fire": _fire_one,
    "skip": _skip,
    "pause": _pause,
    "resume": _resume,
}


@pytest.mark.parametrize("act", list(ACTS), ids=list(ACTS))
def test_a_write_to_one_schedule_leaves_another_as_it_was(
    act: str, sync_conn: SyncConnection, db_dsn: str
) -> None:
    fleet.operations(sync_conn)
    for name in ("nightly", "hourly"):
        sync_conn.execute(
            "INSERT INTO fleetq.schedules (name, cron, project, operation, commit_sha) "
            "VALUES ($1, '0 3 * * *', 'tools', 'lint', $2)",
            [name, SHA],
        )
    assert _fire(sync_conn, "hourly", "1 hour")[1]  # a tick of its own, with its job
    # the acted-on row written again, so it comes after the other in the table: a
    # lookup that lost its key reads the other one first
    sync_conn.execute("UPDATE fleetq.schedules SET cron = cron WHERE name = 'nightly'")
    other, mine = _rows(sync_conn, "hourly"), _rows(sync_conn, "nightly")
    ACTS[act](sync_conn)
    assert _rows(sync_conn, "nightly") != mine, "the act changed nothing: it proves nothing"
    assert not stamps.future_stamps(db_dsn), f"{stamps.FAILURE} by {act}"
    assert _rows(sync_conn, "hourly") == other


def test_a_tick_already_recorded_is_never_fired_again(sync_conn: SyncConnection) -> None:
    """The schedule's row lock and last tick keep a tick from firing twice; its recorded
    tick is the last word: a tick found recorded (however last_tick came to lag it) is
    answered not fired, and no second job is made."""
    fleet.operations(sync_conn)
    sync_conn.execute(
        "INSERT INTO fleetq.schedules (name, cron, project, operation, commit_sha) "
        "VALUES ('nightly', '0 3 * * *', 'tools', 'lint', $1)",
        [SHA],
    )
    tick = "clock_timestamp() + interval '1 day'"
    (at,) = sync_conn.execute(f"SELECT date_trunc('second', {tick})").fetchone() or (None,)
    sync_conn.execute(
        "INSERT INTO fleetq.schedule_ticks (schedule, tick) VALUES ('nightly', $1)", [at]
    )
    row = sync_conn.execute(
        "SELECT job_id, fired FROM fleetq.fire_schedule('nightly', $1, $2)", [at, SHA]
    ).fetchone()
    assert row == (None, False)
    assert sync_conn.execute("SELECT count(*) FROM fleetq.jobs").fetchone() == (0,)
