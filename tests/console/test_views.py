"""Every view, driven through Pilot on the scenario: what the operator sees is true."""

from __future__ import annotations

from typing import Any

from textual.command import CommandList
from textual.widgets import DataTable, Static

from fleetq.console.messages import Hint
from fleetq.console.views.jobs import JobsView
from fleetq.core.db import connect
from fleetq.core.jobpages import JobFilter
from tests.console import scenario
from tests.console.conftest import SIZE, console, settled, show, until


def _text(app: object, selector: str) -> str:
    widget = app.query_one(selector, Static)  # type: ignore[attr-defined]
    return str(widget.render())


def _column(table: DataTable[Any], key: str) -> list[str]:
    return [str(table.get_cell(row.key, key)) for row in table.ordered_rows]


async def test_overview_shows_lanes_alerts_and_runners(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "1")
        alerts = _text(app, "#alerts")
        assert "1 runner(s) offline: old-1/r1" in alerts
        assert "1 stop(s) pending" in alerts
        assert "1 queued job(s) no runner can take" in alerts
        lanes: DataTable[object] = app.query_one("#overview-lanes", DataTable)
        assert _column(lanes, "lane") == ["checks", "control"]
        # claims in the last 15 min: class 1 waited 10 s and 70 s, class 2 2 s and 5 s
        waits = _text(app, "#waits")
        assert "class 1  p50 40.0s  p95 1m07s  (2 jobs)" in waits
        assert "class 2  p50 3.5s" in waits and "class 0" not in waits
        # ends in the last 30 min: 4; in the last minute: a success and a cancel
        assert "4 finished, 2 in the last 60s bucket" in _text(app, "#throughput")
        fleet_panel = _text(app, "#fleet")
        assert "active 2" in fleet_panel and "draining 1" in fleet_panel
        assert "offline 1" in fleet_panel


async def test_lanes_view(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "2")
        table: DataTable[object] = app.query_one("#lanes-table", DataTable)
        checks = {str(key.value): str(table.get_cell("checks", key)) for key in table.columns}
        # queued 4 (3 lint + browser), running 1, one stop pending, 2 of 4 online slots
        assert [checks[k] for k in ("queued", "claimed", "running", "stop pending")] == [
            "4",
            "0",
            "1",
            "1",
        ]
        # slots in use: build-1's two (the running job and the pending stop) of the 4 slots
        # of online runners (old-1 is offline)
        assert checks["slots in use"].endswith("2/4")
        assert checks["oldest wait"] == "4m00s"  # the browser job waited since CLOCK - 240 s


async def test_jobs_view_reasons_marks_and_filter(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        view = app.query_one(JobsView)
        table = view.table
        assert len(table.rows) == len(ids)
        why = str(table.get_cell(str(ids["unplaceable"]), "why"))
        assert why == ("no runner eligible now: 3 missing capability browser, 1 too small")
        queued = str(table.get_cell(str(ids["queued0"]), "why"))
        assert queued == "waiting its turn: 1/4 runners eligible"
        assert str(table.get_cell(str(ids["running"]), "lease")) == "20.0s"
        assert str(table.get_cell(str(ids["stopping"]), "state")) == "cancelled (stop pending)"
        # space marks the row under the cursor and moves down
        table.move_cursor(row=table.get_row_index(str(ids["queued2"])))
        await pilot.press("space", "space")
        assert view.marked == {ids["queued2"], ids["queued1"]}
        # the filter narrows the page
        await pilot.press("slash")
        await pilot.press(*"state:queued", "enter")
        await show(pilot, "3")
        assert set(_column(table, "id")) == {
            str(ids[n]) for n in ("queued0", "queued1", "queued2", "unplaceable")
        }
        await pilot.press("slash")
        await pilot.press(*" bogus:1", "enter")  # refused with a message, box left open
        assert view.has_class("filtering")
        assert view.where == JobFilter.model_validate({"state": "queued"})


async def test_detail_shows_eligibility_timeline_and_overlap(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, ids = fleet
    app = console(dsn, job=ids["overlap"], view="detail")
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "4")
        timeline = _text(app, "#detail-timeline")
        assert "t1 edge-1/r1" in timeline and "t2 build-1/r1" in timeline
        assert "overlap t1∥t2: 9.0s, end confirmed, t1 superseded" in timeline
        assert "superseded (stop confirmed)" in timeline
        summary = _text(app, "#detail-summary")
        assert summary.startswith("were it queued now: 1/4 runners eligible")
        eligibility: DataTable[object] = app.query_one("#detail-eligibility", DataTable)
        verdicts = {str(row.value): str(eligibility.get_row(row)[2]) for row in eligibility.rows}
        assert verdicts == {
            "build-1/r1": "no capacity now: 2/2 checks slots in use",
            "edge-1/r1": "draining",
            "gpu-1/r1": "eligible",
            "old-1/r1": "offline",
        }
        # each budget that can end it, counted apart (reassigned once: a lease expired)
        assert "budgets: attempt 1 of 1 · lost 0 · reassigned 1 of " in _text(app, "#detail-head")


async def test_enter_opens_the_job_under_the_cursor(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        table = app.query_one(JobsView).table
        table.move_cursor(row=table.get_row_index(str(ids["unplaceable"])))
        await pilot.press("enter")
        await show(pilot, "4")
        assert app.current == "detail" and app.detail_job == ids["unplaceable"]
        assert "0/4 runners eligible" in _text(app, "#detail-summary")


async def test_runners_view(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "5")
        table: DataTable[object] = app.query_one("#runners-table", DataTable)

        def cell(runner: str, column: str) -> str:
            return str(table.get_cell(runner, column))

        assert cell("edge-1/r1", "state") == "draining"
        assert cell("edge-1/r1", "why") == "kernel update · alice · 5m00s ago"
        assert cell("edge-1/r1", "stale") == "1"  # a stale-lease rejection
        assert cell("old-1/r1", "state") == "offline"
        assert cell("build-1/r1", "memory").endswith("512/8192")
        assert cell("build-1/r1", "jobs") == "2"  # the running job and the pending stop


async def test_events_view_and_filter(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "6")
        table: DataTable[object] = app.query_one("#events-table", DataTable)
        kinds = _column(table, "kind")
        assert kinds[0] == "cancelled" and len(kinds) == 21  # newest first
        await pilot.press("slash", *"kind:stopped", "enter")  # searched on the server
        await until(pilot, lambda: _column(table, "kind") == ["stopped"])


async def test_untrusted_text_is_shown_literally(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, ids = fleet
    app = console(dsn, job=ids["hostile"], view="detail")
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "4")
        head = app.query_one("#detail-head", Static).render()
        text = str(head)
        shown = r"[/bold] boom [red]not red[/red] \x1b[31mESC\x1b[0m \x1b]0;pwned\x07 done"
        assert f"reason: {shown}" in text  # escaped as the CLI shows it, never acted on
        assert "\x1b" not in text and "\x07" not in text
        output = str(app.query_one("#detail-output", Static).render())
        assert shown in output
        assert "\x1b" not in output and "\x07" not in output
        await show(pilot, "3")
        why = app.query_one(JobsView).table.get_cell(str(ids["hostile"]), "why")
        assert "[/bold] boom [red]not red[/red]" in str(why)


async def test_views_switch_by_name_and_help_opens(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "1")
        await pilot.press("colon", *"runners", "enter")
        await pilot.pause()
        assert app.current == "runners"
        await pilot.press("question_mark")
        await pilot.pause()
        assert type(app.screen).__name__ == "Help"
        await pilot.press("escape")
        await pilot.press("f1")
        await pilot.pause()
        assert type(app.screen).__name__ == "Help"


def test_scenario_clock_is_pinned() -> None:
    assert scenario.at(0) == scenario.CLOCK


async def test_command_palette_switches_views(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "1")
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"View: events")
        await until(pilot, lambda: app.screen.query_one(CommandList).option_count > 0)
        await pilot.press("enter")
        await until(pilot, lambda: app.current == "events")


async def test_colon_job_opens_a_detail_and_an_unknown_job_is_a_message(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "colon", *f"job {ids['overlap']}", "enter")
        assert (app.current, app.detail_job) == ("detail", ids["overlap"])
        assert "job 2" in _text(app, "#detail-head")
        await show(pilot, "colon", *"999", "enter")
        assert app.stale_since is None  # a missing job is not an outage
        assert _text(app, "#detail-head") == "no job 999"
        assert app.detail_job is None  # said once: later reads do not look for it again


async def test_the_events_cursor_stays_on_its_event_as_new_ones_arrive(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "6")
        table: DataTable[Any] = app.query_one("#events-table", DataTable)
        table.move_cursor(row=3)
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        with connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO fleetq.events (kind) SELECT 'x' FROM generate_series(1, 5)")
        await show(pilot, "r")  # a full resync redraws the tail
        assert _column(table, "kind")[:5] == ["x"] * 5
        assert table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value == key
        with connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO fleetq.events (kind) VALUES ('y')")
        before = app.loads
        app.post_message(Hint())  # a notification: new rows are added in place
        await settled(pilot, before)
        assert _column(table, "kind")[0] == "y"
        assert table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value == key


async def test_lanes_view_shows_a_lanes_runners_and_its_queue_history(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Lane → who could take its work now and why the others could not; its queue depth
    and wait by class over the last hour, a gap where nothing was sampled."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "2")
        table: DataTable[object] = app.query_one("#lanes-table", DataTable)
        table.move_cursor(row=table.get_row_index("checks"))
        await pilot.pause()
        panel = _text(app, "#lane-detail")
        assert "1 of 4 runner(s) serving checks can claim now" in panel
        lines = panel.splitlines()
        draining = next(line for line in lines if "edge-1" in line)
        assert "✗" in draining and "draining: kernel update" in draining
        offline = next(line for line in lines if "old-1" in line)
        assert "✗" in offline and "no heartbeat for 15m00s" in offline
        ready = next(line for line in lines if "build-1" in line)
        # a full runner cannot claim now: ✗, not counted (issue 45)
        assert ready.lstrip().startswith("✗") and "slots 2/2" in ready and "full" in ready
        at = lines.index(next(line for line in lines if "class 1 queued" in line))
        depth, wait = lines[at], lines[at + 1]
        assert "now 0 · peak 18" in depth
        spark = depth.split("queued ", 1)[1][:60]
        assert spark[9:14] == "     "  # 50..46 minutes ago: not sampled
        assert spark.index("█") == 59 - 25  # the peak, 25 minutes ago
        assert "class 0" not in panel  # quiet all hour
        assert "wait p50" in wait and "peak 1m48s" in wait
        # the overview's lanes show the same hour, two minutes a column
        await show(pilot, "1")
        lanes: DataTable[object] = app.query_one("#overview-lanes", DataTable)
        overview_spark = str(lanes.get_cell("checks", "queued, 60 min"))
        assert len(overview_spark) == 30 and "█" in overview_spark
        quiet = str(lanes.get_cell("control", "queued, 60 min"))
        assert quiet[5:7] == "  " and set(quiet) == {"▁", " "}  # empty, and the gap
        await show(pilot, "2")
        table.move_cursor(row=table.get_row_index("control"))
        await pilot.pause()
        assert "nothing queued or claimed in the window" in _text(app, "#lane-detail")
