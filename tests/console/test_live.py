"""Live updates: a change made elsewhere shows within a second, whether it NOTIFYs (work,
control) or only logs an event (claims, starts, outcomes), and the console recovers when
its LISTEN connection is killed."""

from __future__ import annotations

from datetime import datetime

import pytest
from textual.widgets import DataTable

from fleetq.console.live import APPLICATION_NAME
from fleetq.console.messages import Health, Hint
from fleetq.console.views.events import EventsView
from fleetq.console.views.jobs import JobsView
from fleetq.core import migrate
from fleetq.core.db import connect
from fleetq.core.views import Overview
from tests import factories
from tests.console.conftest import SIZE, console, settled, show, until


def _submit(dsn: str) -> int:
    """Submit through the protocol (which NOTIFYs), from another connection."""
    with connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT job_id FROM fleetq.submit('tools', 'lint', $1, NULL, NULL, NULL, 'ci', '{}')",
            [factories.SHA],
        ).fetchone()
    assert row is not None
    return int(row[0])


def _listed(app: object, job: int) -> bool:
    return str(job) in {k.value for k in app.query_one(JobsView).table.rows}  # type: ignore[attr-defined]


async def test_a_notified_change_shows_within_a_second(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, _ids = fleet
    # No periodic resync during the test: only the NOTIFY can explain the update.
    app = console(dsn, live=True, clock=None, resync_s=600)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        await until(pilot, lambda: app.follower.connected.is_set())
        job = _submit(dsn)
        took = await until(pilot, lambda: _listed(app, job), deadline=1.0)
        print(f"\nconsole showed job {job} {took * 1000:.0f} ms after its submit committed")


async def test_an_event_with_no_notification_shows_within_a_second(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Claims, starts and outcomes log events and send no NOTIFY (one would serialize
    the queue's commits): the console polls the newest event's id."""
    dsn, _ids = fleet
    app = console(dsn, live=True, clock=None, resync_s=600)  # no resync during the test
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "6")
        events = app.query_one(EventsView)
        await until(pilot, lambda: app.follower.connected.is_set() and not app.busy)
        with connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "INSERT INTO fleetq.events (kind) VALUES ('quiet') RETURNING id"
            ).fetchone()
        assert row is not None
        took = await until(pilot, lambda: row[0] in events.seen, deadline=1.0)
        print(f"\nconsole showed event {row[0]} {took * 1000:.0f} ms after it committed")


async def test_recovers_after_its_listen_connection_is_killed(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, _ids = fleet
    app = console(dsn, live=True, clock=None, resync_s=600)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        await until(pilot, lambda: app.follower.connected.is_set())
        with connect(dsn, autocommit=True) as conn:
            killed = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = $1 AND datname = current_database()",
                [APPLICATION_NAME],
            ).fetchone()
        assert killed == (1,)
        await until(pilot, lambda: app.outages == 1)
        await until(pilot, lambda: app.stale_since is None and app.follower.connected.is_set())
        assert app.check_action("cancel_jobs", ()) is True  # actions are back after resync
        job = _submit(dsn)
        await until(pilot, lambda: _listed(app, job), deadline=2.0)


async def test_actions_are_off_while_stale(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        assert app.check_action("cancel_jobs", ()) is True
        app.post_message(Health(datetime.now().astimezone(), why="test: connection lost"))
        await until(pilot, lambda: app.stale_since is not None)
        assert "STALE since" in app.sub_title and "test: connection lost" in app.sub_title
        await pilot.press("C")  # shown, and says why it does nothing
        await pilot.pause()
        assert type(app.screen).__name__ != "Confirm"
        assert any("not connected" in str(n.message) for n in app._notifications)


async def test_a_database_that_does_not_answer_shows_stale_and_no_action(
    empty_dsn: str,
) -> None:
    """Started on a database without the schema: the console stays up, says why, and
    keeps trying (it would resync once `fleetq migrate` has run)."""
    app = console(empty_dsn)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.stale_since is not None)
        assert "STALE since" in app.sub_title and not app.ready
        assert "fleetq migrate" in app.sub_title  # says why, not just "reconnecting"
        await pilot.press("3")
        await pilot.press("C")
        await pilot.pause()
        assert any("not connected" in str(n.message) for n in app._notifications)
        migrate.migrate(empty_dsn)  # `fleetq migrate`: the console gets going by itself
        await until(pilot, lambda: app.ready and app.stale_since is None, deadline=30)
        assert app.outages == 1  # the retries were one outage
        assert app.check_action("cancel_jobs", ()) is True


async def test_a_load_that_fails_unexpectedly_does_not_wedge_the_console(
    fleet: tuple[str, dict[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in a read (not a database error) is one failed load: stale, then retried,
    then live again; later reads are not stuck behind it."""
    dsn, _ids = fleet
    app = console(dsn, live=True, clock=None, resync_s=600)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "1")
        original = app.source.overview
        calls = 0

        async def broken_once(at: datetime) -> Overview:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("a bug in a read")
            return await original(at)

        monkeypatch.setattr(app.source, "overview", broken_once)
        app.post_message(Hint())
        await until(pilot, lambda: app.outages == 1)
        await until(pilot, lambda: app.stale_since is None and not app.busy)
        assert calls >= 2 and app.follower.connected.is_set()


async def test_an_event_committed_late_still_shows(fleet: tuple[str, dict[str, int]]) -> None:
    """Event ids are taken at insert: an event whose transaction commits after a newer one
    was read must not be skipped."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "6")
        events = app.query_one(EventsView)
        with connect(dsn) as slow, connect(dsn, autocommit=True) as fast:
            late = slow.execute(
                "INSERT INTO fleetq.events (kind) VALUES ('late') RETURNING id"
            ).fetchone()
            early = fast.execute(
                "INSERT INTO fleetq.events (kind) VALUES ('early') RETURNING id"
            ).fetchone()
            assert late is not None and early is not None and late[0] < early[0]
            before = app.loads
            app.post_message(Hint())
            await settled(pilot, before)
            assert early[0] in events.seen and late[0] not in events.seen
            slow.commit()
        before = app.loads
        app.post_message(Hint())
        await settled(pilot, before)
        assert late[0] in events.seen
        table = app.query_one("#events-table", DataTable)
        assert str(late[0]) in table.rows
