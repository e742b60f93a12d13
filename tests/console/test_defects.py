"""Defects an operator ran into (issue 15), each with a Pilot test that failed before."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from typing import Any

from textual.widgets import DataTable, Static

from fleetq.console.dialogs import Confirm
from fleetq.console.messages import Health, Hint
from fleetq.console.views.jobs import JobsView
from fleetq.core.db import connect
from fleetq.core.jobpages import JobFilter
from fleetq.core.models import Event, JobId
from tests.console.conftest import SIZE, console, settled, show, until
from tests.console.test_views import _column


async def test_latest_events_on_the_overview_keep_up(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "1")
        table: DataTable[Any] = app.query_one("#overview-events", DataTable)
        for round_ in range(3):
            with connect(dsn, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO fleetq.events (kind) SELECT 'x' FROM generate_series(1, 30)"
                )
                (newest,) = conn.execute("SELECT max(id) FROM fleetq.events").fetchone()  # type: ignore[misc]
            before = app.loads
            app.post_message(Hint())
            await settled(pilot, before)
            assert table.ordered_rows[0].key.value == str(newest), round_
            assert table.scroll_y == 0


async def test_marks_the_filter_hides_are_never_acted_on_and_esc_clears_them(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        view = app.query_one(JobsView)
        _cursor_to(view, ids["queued0"])
        await pilot.press("space")
        _cursor_to(view, ids["running"])
        await pilot.press("space")
        assert view.marked == {ids["queued0"], ids["running"]}
        await pilot.press("slash", *"state:running", "enter")
        await show(pilot, "3")
        assert "1 hidden by the filter" in str(view.query_one("#jobs-status", Static).render())
        await pilot.press("C")
        await pilot.pause()
        assert isinstance(app.screen, Confirm)
        body = str(app.screen.body)
        assert f"Cancel 1 job: {ids['running']}" in body
        assert "1 marked job(s) the filter hides are left alone" in body
        await pilot.press("n")
        await pilot.pause()
        await pilot.press("escape")
        assert view.marked == set()
        assert "marked" not in str(view.query_one("#jobs-status", Static).render())


async def test_v_marks_a_range(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        view = app.query_one(JobsView)
        keys = [row.key.value for row in view.table.ordered_rows]
        view.table.move_cursor(row=1)
        await pilot.press("space")  # marks row 1, moves to row 2
        view.table.move_cursor(row=4)
        await pilot.press("v")
        assert {str(j) for j in view.marked} == set(keys[1:5])


async def test_enter_follows_the_focused_button(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        _cursor_to(app.query_one(JobsView), ids["queued0"])
        await pilot.press("C")
        await pilot.pause()
        assert isinstance(app.screen, Confirm) and app.screen.focused is not None
        assert app.screen.focused.id == "no"
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, Confirm)
        with connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT state FROM fleetq.jobs WHERE id = $1", [ids["queued0"]]
            ).fetchone()
        assert row == ("queued",)


def _cursor_to(view: JobsView, job: int) -> None:
    view.table.move_cursor(row=view.table.get_row_index(str(job)))


async def test_the_detail_scrolls_to_its_events_and_esc_goes_back(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=(100, 30)) as pilot:
        await show(pilot, "3")
        _cursor_to(app.query_one(JobsView), ids["overlap"])
        await pilot.press("enter")
        await show(pilot, "4")
        assert app.current == "detail"
        events: DataTable[Any] = app.query_one("#detail-events", DataTable)
        assert app.focused is events
        await pilot.press("down", "down")
        await pilot.pause()
        # the events table's cursor row is on screen
        row_y = events.region.y + 1 + events.cursor_row - int(events.scroll_y)
        assert 0 <= row_y < 30 and events.region.height > 0, (events.region, row_y)
        await pilot.press("escape")
        await pilot.pause()
        assert app.current == "jobs"
        await pilot.press("enter")
        await show(pilot, "4")
        await pilot.press("backspace")
        await pilot.pause()
        assert app.current == "jobs"


async def test_the_events_filter_is_shown_an_empty_result_says_so_and_enter_opens_the_job(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "1")
        await show(pilot, "6")
        status = app.query_one("#events-status", Static)
        assert str(status.render()).startswith("21 of the newest 21 events")
        await pilot.press("slash", *"nosuchword", "enter")
        await until(pilot, lambda: "no event matches kind:nosuchword" in str(status.render()))
        await pilot.press("escape")  # clears the search
        await pilot.pause()
        assert str(status.render()).startswith("21 of the newest 21 events")
        await pilot.press("slash", *"stopped", "enter")  # a bare word is a kind
        await until(pilot, lambda: "1 event(s) matching kind:stopped" in str(status.render()))
        await pilot.press("enter")
        await show(pilot, "4")
        assert (app.current, app.detail_job) == ("detail", ids["overlap"])
        await pilot.press("escape")
        await pilot.pause()
        assert app.current == "events"
        await pilot.press("escape")
        await pilot.pause()
        assert app.current == "events"  # the filter first
        await pilot.press("escape")
        await pilot.pause()
        assert app.current == "overview"


async def test_stale_overview_never_says_all_clear(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "1")
        app.post_message(Health(datetime.now().astimezone(), why="connection refused"))
        await until(pilot, lambda: app.stale_since is not None)
        alerts = str(app.query_one("#alerts", Static).render())
        assert "not connected since" in alerts and "connection refused" in alerts
        assert "all clear" not in alerts
        assert "connection refused" in app.sub_title


async def test_the_view_opened_on_has_the_keyboard(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, _ids = fleet
    app = console(dsn, readonly=True, view="jobs")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.ready and not app.busy)
        await pilot.pause()
        view = app.query_one(JobsView)
        assert app.focused is view.table
        await pilot.press("slash")
        assert view.has_class("filtering")


async def test_actions_outside_their_view_say_where_they_work(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "1")
        app.action_cancel_jobs()  # as the palette calls it
        app.action_runner_state("paused")
        await pilot.pause()
        said = [str(n.message) for n in app._notifications]
        assert any(
            "cancel works in the jobs view (3) and the job detail view (4)" in m for m in said
        )
        assert any("drain, pause and resume works in the runners view (5)" in m for m in said)


async def test_resume_on_an_active_runner_changes_nothing(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "5")
        table: DataTable[Any] = app.query_one("#runners-table", DataTable)
        table.move_cursor(row=table.get_row_index("build-1/r1"))
        await pilot.press("u")
        await pilot.pause()
        assert not isinstance(app.screen, Confirm)
        assert any("already active" in str(n.message) for n in app._notifications)


async def test_a_heartbeat_newer_than_the_screens_clock_is_not_a_negative_age() -> None:
    from fleetq.console.text import age

    now = datetime(2026, 1, 1, 12, 0, 0)
    assert age(now + timedelta(milliseconds=344), now) == age(now, now)
    assert not age(now + timedelta(milliseconds=344), now).startswith("-")


async def test_the_overlaps_view_lists_closed_windows_and_opens_their_job(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "7")
        table: DataTable[Any] = app.query_one("#overlaps-table", DataTable)
        jobs = _column(table, "job")
        assert str(ids["overlap"]) in jobs  # closed: gone from the overview's alerts
        row = table.get_row_index(
            next(
                r.key
                for r in table.ordered_rows
                if str(table.get_cell(r.key, "job")) == str(ids["overlap"])
            )
        )
        assert "end confirmed" in str(table.get_row_at(row)[-1])
        table.move_cursor(row=row)
        await pilot.press("enter")
        await show(pilot, "4")
        assert (app.current, app.detail_job) == ("detail", ids["overlap"])


async def test_vi_and_less_keys_move_the_cursor(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        table = app.query_one(JobsView).table
        await pilot.press("j", "j", "k")
        assert table.cursor_row == 1
        await pilot.press("G")
        assert table.cursor_row == table.row_count - 1
        await pilot.press("home")
        assert table.cursor_row == 0 and table.scroll_x == 0


async def test_a_narrow_terminal_keeps_age_and_reason_and_w_shows_everything(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=(100, 30)) as pilot:
        await show(pilot, "3")
        view = app.query_one(JobsView)
        assert view.columns == ("mark", "id", "state", "job", "commit", "age", "lease", "why")
        assert str(view.table.get_cell(str(ids["running"]), "job")) == "tools/lint"
        await pilot.press("w")
        await pilot.pause()
        assert "owner" in view.columns and "lane" in view.columns
        assert str(view.table.get_cell(str(ids["running"]), "token")) == "1"


def _ship(dsn: str, job: int, token: int, seq: int, text: str) -> None:
    """A chunk of a run's output, as its runner ships it (with the NOTIFY it sends)."""
    with connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO fleetq.job_output (job_id, lease_version, seq, data) "
            "VALUES ($1, $2, $3, $4)",
            [job, token, seq, text.encode()],
        )
        conn.execute("SELECT pg_notify('fleetq_output', $1)", [str(job)])


async def test_the_detail_follows_a_running_jobs_output_live(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, ids = fleet
    running, stopped = ids["running"], ids["stopping"]
    _ship(dsn, running, 1, 0, "collecting 12 items\n")
    _ship(dsn, stopped, 1, 0, "step 1 of 3\nstep 2 of 3\n")  # cancelled mid-run
    app = console(dsn, live=True, clock=None, resync_s=600, job=running, view="detail")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.follower.connected.is_set() and app.ready)
        output = app.query_one("#detail-output", Static)
        await until(pilot, lambda: "collecting 12 items" in str(output.render()))
        _ship(dsn, running, 1, 1, "test_a PASSED\n\x1b]0;pwned\x07test_b PASSED\n")
        await until(pilot, lambda: "test_b PASSED" in str(output.render()), deadline=3)
        assert "\x1b" not in str(output.render())
        assert "\\x1b]0;pwned\\x07test_b PASSED" in str(output.render())  # shown, not acted on
        app.detail_job = JobId(stopped)
        await show(pilot, "4")
        await until(pilot, lambda: "step 2 of 3" in str(output.render()))
        assert "run t1" in str(output.render())


async def test_enter_on_a_runner_or_a_lane_lists_its_jobs_and_e_its_events(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "5")
        table: DataTable[Any] = app.query_one("#runners-table", DataTable)
        table.move_cursor(row=table.get_row_index("build-1/r1"))
        await show(pilot, "enter")
        assert app.current == "jobs" and app.where == JobFilter(runner="build-1/r1")
        jobs = app.query_one(JobsView)
        assert set(_column(jobs.table, "id")) >= {str(ids["running"]), str(ids["stopping"])}
        await pilot.press("escape")  # back to the runners
        await pilot.pause()
        assert app.current == "runners"
        await pilot.press("e")
        await pilot.pause()
        assert app.current == "events"
        runners = {str(c) for c in _column(app.query_one("#events-table", DataTable), "runner")}
        assert runners == {"build-1/r1"}
        await show(pilot, "2")
        await show(pilot, "enter")  # the first lane: checks
        assert app.current == "jobs" and app.where == JobFilter(lane="checks")


async def test_z_freezes_the_screen_until_z_again(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "6")
        await pilot.press("Z")
        assert "FROZEN" in app.sub_title
        with connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO fleetq.events (kind) VALUES ('while_frozen')")
        before = app.loads
        app.post_message(Hint())
        await until(pilot, lambda: app.reads.missed)  # the hint arrived and was held back
        assert app.loads == before and not app.busy  # nothing read, nothing moved
        await pilot.press("Z")
        await settled(pilot, before)
        assert "while_frozen" in _column(app.query_one("#events-table", DataTable), "kind")


async def test_c_copies_the_selected_jobs_id_and_commit(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        _cursor_to(app.query_one(JobsView), ids["running"])
        await pilot.press("c")
        assert app.clipboard.startswith(f"{ids['running']} ")
        assert len(app.clipboard.split()[1]) == 40


async def test_s_sorts_the_jobs_and_starts_at_the_top(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """A sort is a new listing: it is read from its first row (kept on its old job, the
    cursor held the list scrolled part-way down, its top rows hidden: found driving)."""
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        view = app.query_one(JobsView)
        assert _column(view.table, "id")[0] == str(max(ids.values()))  # newest first
        _cursor_to(view, ids["running"])
        await pilot.press("s")  # oldest first
        await pilot.pause()
        assert _column(view.table, "id")[0] == str(min(ids.values()))
        assert view.table.cursor_row == 0 and view.table.scroll_y == 0
        assert "oldest first" in str(view.query_one("#jobs-status", Static).render())
        await pilot.press("s", "s")  # least lease left first: the running job leads
        await pilot.pause()
        assert _column(view.table, "id")[0] == str(ids["running"])


async def test_incident_filters_a_free_word_and_colon_jobs(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "1")
        await pilot.press("colon", *"jobs reassigned>0", "enter")
        await until(pilot, lambda: app.current == "jobs")
        await show(pilot, "3")
        assert app.where == JobFilter(reassigned=True)
        view = app.query_one(JobsView)
        assert str(ids["overlap"]) in _column(view.table, "id")  # reassigned once
        assert str(ids["queued0"]) not in _column(view.table, "id")
        await pilot.press("slash", *"browser", "enter")  # a free word: an operation
        await show(pilot, "3")
        assert _column(view.table, "id") == [str(ids["unplaceable"])]
        await pilot.press("slash", *"lost>0 0123456", "enter")  # a commit prefix too
        await show(pilot, "3")
        assert view.where == JobFilter(lost=True, word="0123456")
        await pilot.press("colon", *"jobs bogus:1", "enter")
        await until(pilot, lambda: any("bogus" in str(n.message) for n in app._notifications))


async def test_slash_in_the_detail_shows_only_the_output_lines_holding_a_word(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, ids = fleet
    running = ids["running"]
    _ship(dsn, running, 1, 0, "collecting 3 items\ntest_a PASSED\ntest_b FAILED\ntest_c PASSED\n")
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        _cursor_to(app.query_one(JobsView), running)
        await pilot.press("enter")
        await show(pilot, "4")
        output = app.query_one("#detail-output", Static)
        await pilot.press("slash", *"failed", "enter")
        await pilot.pause()
        shown = str(output.render())
        assert "test_b FAILED" in shown and "test_a PASSED" not in shown
        await pilot.press("escape")  # clears the search
        await pilot.pause()
        assert "test_a PASSED" in str(output.render()) and app.current == "detail"
        await pilot.press("escape")  # then goes back
        await pilot.pause()
        assert app.current == "jobs"


async def test_a_read_that_lands_while_the_console_closes_is_dropped(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Closing removes the views' widgets (children first) while the app still reads its
    messages; a read that finished then found a jobs view without its status line and
    ended the console with NoMatches (seen in CI). Here a read is held until the status
    line is gone, and then lands at once (its last query answered from before)."""
    dsn, _ = fleet
    app = console(dsn)
    release = asyncio.Event()
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        jobs = app.query_one(JobsView)
        answered = await app.source.events(None, 10)

        async def held(after: int | None, limit: int = 500) -> list[Event]:
            await release.wait()
            return answered

        app.source.events = held  # type: ignore[method-assign]
        before = app.loads
        app.post_message(Hint())
        await until(pilot, lambda: app.busy)

        async def release_once_the_status_line_is_gone() -> None:
            deadline = time.monotonic() + 10
            # no event says a widget was removed: look once per turn of the loop
            while jobs.query("#jobs-status") and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0)
            release.set()

        releaser = asyncio.ensure_future(release_once_the_status_line_is_gone())
    await releaser
    assert not jobs.query("#jobs-status"), "the status line was never removed"
    assert app.loads == before  # the late read was dropped, not put on screen
