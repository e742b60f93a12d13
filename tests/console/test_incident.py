"""Defects an operator met in an incident hour (issue 45), each with a Pilot test that
failed before its fix. A burst is typed as a terminal delivers it: every key read by the
app before any of them is handled (`burst`), not one key per turn as `pilot.press`."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from rich.console import Console
from textual import events
from textual._xterm_parser import XTermParser
from textual.filter import Monochrome, NoColor
from textual.pilot import Pilot
from textual.widgets import Button, DataTable, Input, Static
from textual.widgets._footer import FooterKey

from fleetq.console.dialogs import DrainForm, HourSheet, hour_text
from fleetq.console.help import Help, help_sheet
from fleetq.console.messages import Hint
from fleetq.console.screenful import tick
from fleetq.console.typeahead import HOLD_LIMIT_S, read_escape_digits_as_alt, unmerged
from fleetq.console.views.detail import DetailView
from fleetq.console.views.events import EventsView
from fleetq.console.views.jobs import JobsView
from fleetq.console.views.lanes import lane_panel
from fleetq.console.views.runners import COLUMNS as RUNNER_COLUMNS
from fleetq.console.views.runners import RunnersView, runner_cells
from fleetq.core import roles
from fleetq.core.db import as_uri, connect
from fleetq.core.jobpages import JobFilter
from fleetq.core.models import JobId, JobState, Runner, RunnerId, RunnerState
from fleetq.core.views import EventQuery
from tests import factories
from tests.console import scenario
from tests.console.conftest import SIZE, console, show, until

NAMES = {"/": "slash", ":": "colon", " ": "space", "\n": "enter"}


def login_dsn(dsn: str, login: str) -> str:
    """`dsn` logged in as `login` (the test server trusts local logins)."""
    parts = urlsplit(as_uri(dsn))
    return urlunsplit(parts._replace(netloc=f"{login}@{parts.netloc.rpartition('@')[2]}"))


def burst(pilot: Pilot[None], keys: str) -> None:
    """Queue every key of `keys` at once (`\\n` is Enter), as a fast typist's terminal
    does: none is handled before the last is read."""
    app = pilot.app
    assert app._driver is not None
    for char in keys:
        event = events.Key(NAMES.get(char, char), "\r" if char == "\n" else char)
        event.set_sender(app)
        app._driver.send_message(event)


def _row_keys(table: DataTable[Any]) -> list[str]:
    return [str(row.key.value) for row in table.ordered_rows]


def _cursor_visible(table: DataTable[Any]) -> bool:
    height = table.scrollable_content_region.height - table.header_height
    return table.scroll_y <= table.cursor_row < table.scroll_y + height


def _more_jobs(dsn: str, n: int) -> None:
    with connect(dsn, autocommit=True) as conn:
        for i in range(n):
            factories.job(
                conn, op=("tools", "lint"), submitted_by="bulk", payload={"i": i}, lost_count=i % 3
            )


def _runner(now: datetime, **changes: Any) -> Runner:
    """An active runner of build-1 with one checks lane, heard from at `now`."""
    runner = Runner(
        id=RunnerId("build-1/r1"),
        node="build-1",
        name="r1",
        capabilities=[],
        memory_mb=8192,
        cpu_millis=4000,
        reserved_memory_mb=0,
        reserved_cpu_millis=0,
        state=RunnerState.ACTIVE,
        offline=False,
        state_reason=None,
        state_actor=None,
        state_changed_at=now,
        last_heartbeat_at=now,
        stale_rejections=0,
        lanes={"checks": (2, 0)},
        live_jobs=0,
    )
    return runner.model_copy(update=changes)


# ---- 1, 2: keys typed quickly --------------------------------------------------------


async def test_a_filter_typed_in_one_burst_reaches_the_filter_box(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: the box took focus a turn after `/`, so `s` re-sorted the table and
    the filter stayed empty."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        view = app.query_one(JobsView)
        burst(pilot, "/state:failed\n")
        await until(pilot, lambda: app.where.state == JobState.FAILED and not app.busy)
        assert view.sort == 0  # the `s` of "state" went into the box
        assert not view.has_class("filtering")


async def test_a_job_typed_on_the_command_line_in_one_burst_opens(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: the keys after `:` reached the command line before it had mounted,
    and `:job N⏎` opened nothing."""
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "1")
        burst(pilot, f":job {ids['overlap']}\n")
        await until(pilot, lambda: app.current == "detail")
        assert app.detail_job == ids["overlap"]
        view = app.query_one(DetailView)
        await until(pilot, lambda: view.detail is not None)
        assert view.detail is not None and view.detail.job.id == ids["overlap"]


async def test_a_view_key_and_moves_in_one_burst_land_on_the_right_row(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: `3 j j j ⏎` moved the overview's table (and the jobs view had no rows
    yet), so Enter opened the first job."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "1")
        burst(pilot, "3jjj\n")
        await until(pilot, lambda: app.current == "detail", deadline=15)
        rows = _row_keys(app.query_one(JobsView).table)
        assert str(app.detail_job) == rows[3]


async def test_the_cursor_stays_on_a_visible_row_after_a_sort(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: `g s` kept the scroll at the top while the cursor's job moved to the
    end: Enter then opened a job off screen.

    Checked as the sort returns, before a refresh: Textual's own cursor watcher scrolls
    to the cursor *after* the next refresh, from row offsets that are recomputed only
    when the table is idle, so a Pilot that pauses first saw the watcher's scroll, and
    passed on the old code; on a real terminal with 500 rows that late scroll could
    leave the cursor a row past the bottom edge. The sort itself must set the scroll."""
    dsn, _ids = fleet
    _more_jobs(dsn, 40)
    app = console(dsn)
    async with app.run_test(size=(120, 24)) as pilot:
        await show(pilot, "3")
        view = app.query_one(JobsView)
        table = view.table
        await pilot.press("g")  # the newest job, at the top: `s` sends it to the end
        await pilot.pause()
        assert _cursor_visible(table) and table.scroll_y == 0
        for _ in range(4):  # every order: oldest, state, lease left, lost
            view.action_sort()  # what `s` does, checked before any refresh
            assert _cursor_visible(table), (table.cursor_row, table.scroll_y)
            await pilot.pause()
            assert _cursor_visible(table), (table.cursor_row, table.scroll_y)


async def test_esc_clears_the_jobs_filter(fleet: tuple[str, dict[str, int]]) -> None:
    """Red before: Esc with a filter (and no marks) went back to the previous view."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        await pilot.press("slash", *"state:queued", "enter")
        await until(pilot, lambda: app.where.state == JobState.QUEUED and not app.busy)
        await show(pilot, "escape")
        assert (app.current, app.where) == ("jobs", JobFilter())


# ---- 3: destructive dialogs -----------------------------------------------------------


async def test_drain_needs_an_explicit_choice_not_a_bare_enter(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: the reason field had focus, and `d ⏎` drained."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "5")
        table = app.query_one(RunnersView).query_one(DataTable)
        table.move_cursor(row=table.get_row_index("build-1/r1"))
        burst(pilot, "ddisk swap\n")  # the reason, and a bare Enter
        await until(pilot, lambda: isinstance(app.screen, DrainForm))
        form = app.screen
        await until(pilot, lambda: isinstance(form.focused, Button))
        await pilot.pause(0.3)
        assert isinstance(form, DrainForm) and app.screen is form  # still asking
        assert form.query_one("#reason", Input).value == "disk swap"
        assert isinstance(form.focused, Button) and form.focused.id == "yes"
        with connect(dsn) as conn:
            row = conn.execute("SELECT state FROM fleetq.runners WHERE id = 'build-1/r1'")
            assert row.fetchone() == ("active",)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, DrainForm))
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, DrainForm))
        first = app.screen
        await until(pilot, lambda: first.focused is not None)
        assert isinstance(first.focused, Button) and first.focused.id == "no"
        await pilot.press("enter")  # a bare Enter: No
        await until(pilot, lambda: not isinstance(app.screen, DrainForm))
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, DrainForm))
        again = app.screen
        await until(pilot, lambda: again.focused is not None)
        await pilot.press(*"disk", "enter")  # into the reason; Enter: to the Drain button
        assert isinstance(again.focused, Button) and again.focused.id == "yes"
        await pilot.press("enter")
        await until(pilot, lambda: not isinstance(app.screen, DrainForm))
        with connect(dsn) as conn:
            row = conn.execute(
                "SELECT state, state_reason FROM fleetq.runners WHERE id = 'build-1/r1'"
            )
            assert row.fetchone() == ("draining", "disk")


# ---- 5, 6, 7: heartbeats, colour, 80x24 -----------------------------------------------


async def test_heartbeat_ages_follow_the_heartbeats_each_second(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: heartbeats were read every 5 s, so a healthy runner read 4.6s ago."""
    dsn, _ids = fleet
    with connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE fleetq.runners SET last_heartbeat_at = clock_timestamp()")
    app = console(dsn, clock=None, resync_s=60)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "5")
        table = app.query_one(RunnersView).query_one(DataTable)
        for _ in range(3):
            with connect(dsn, autocommit=True) as conn:
                conn.execute("UPDATE fleetq.runners SET last_heartbeat_at = clock_timestamp()")
            await pilot.pause(1.5)
        beat = str(table.get_cell("build-1/r1", "heartbeat"))
        assert beat.endswith("ms ago") or float(beat.removesuffix("s ago")) < 1.6, beat


async def test_no_color_keeps_the_terminal_colours_not_grey_on_grey(
    fleet: tuple[str, dict[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red before: NO_COLOR mapped each colour to its grey, red alerts 237 on 233."""
    dsn, _ids = fleet
    monkeypatch.setenv("NO_COLOR", "1")
    app = console(dsn)
    assert not any(isinstance(f, Monochrome) for f in app._filters)
    assert any(isinstance(f, NoColor) for f in app._filters)


async def test_80x24_keeps_help_and_quit_and_every_runner(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: the footer lost Help and Quit, the overview showed 3 of 4 runners,
    the latest events cut job ids, and the help could not scroll to its end."""
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=(80, 24)) as pilot:
        await show(pilot, "1")
        footer = app.screen.query_one("Footer")
        keys = [k.key for k in footer.query(FooterKey) if k.region.right <= 80]
        assert "question_mark" in keys and "q" in keys
        runners: DataTable[Any] = app.query_one("#overview-runners", DataTable)
        assert runners.row_count == 4
        assert runners.scrollable_content_region.height - runners.header_height >= 4
        recent: DataTable[Any] = app.query_one("#overview-events", DataTable)
        assert recent.columns[recent.ordered_columns[0].key].label.plain == "job"
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, Help)
        body = app.screen.query_one("#help-body")
        await pilot.press("G")
        await pilot.pause()
        assert body.scroll_y > 0 and body.scroll_y == body.max_scroll_y
        del ids


async def test_80x24_shows_cancel_runner_capacity_and_help_in_its_columns(
    fleet: tuple[str, dict[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found driving at 80x24: the jobs footer cut Cancel, the runners table cut its lanes
    (the reason column came first), the help's wrapped lines fell back to column 0, and
    under NO_COLOR the cursor row was only bold. Red before, each."""
    dsn, _ids = fleet
    monkeypatch.setenv("NO_COLOR", "1")
    app = console(dsn)
    async with app.run_test(size=(80, 24)) as pilot:
        await show(pilot, "3")
        footer = app.screen.query_one("Footer")
        assert "C" in [k.key for k in footer.query(FooterKey) if k.region.right <= 80]
        table = app.query_one(JobsView).table
        assert "reverse" in str(table.get_component_styles("datatable--cursor").text_style)
        await show(pilot, "5")
        runners: DataTable[Any] = app.query_one("#runners-table", DataTable)
        shown = 0
        for column in runners.ordered_columns:
            shown += column.get_render_width(runners)
            if column.key.value == "lanes":
                break
        assert shown <= 80
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, Help)
    width = 72  # the sheet's text at 80 columns, inside its border and padding
    printer = Console(width=width, record=True, file=io.StringIO())
    printer.print(help_sheet())
    text = printer.export_text().splitlines()
    section = next(i for i, t in enumerate(text) if t.startswith("Views"))
    indent = text[section].index("1 overview")
    assert text[section + 1][:indent].strip() == "", text[section : section + 2]


async def test_escape_then_a_view_typed_at_once_is_both_keys(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Found driving: Esc then 3 typed quickly reached the app as Alt-3 (a terminal sends
    Alt-x as Esc x), which nothing binds: the help stayed open. Red before."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "1")
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, Help))
        await pilot.press("alt+3")
        await until(pilot, lambda: app.current == "jobs" and not isinstance(app.screen, Help))
        # with the filter box open (found in a second drive): Esc closes it, then the
        # 5 is a view's number, not a character for the box the Esc was closing
        await pilot.press("slash", "a", "b")
        await until(pilot, lambda: isinstance(app.focused, Input))
        await pilot.press("alt+5")
        await until(pilot, lambda: app.current == "runners")
        assert not app.query_one(JobsView).has_class("filtering")


def test_escape_then_a_digit_from_a_terminal_is_read_as_the_two_keys() -> None:
    """Found driving in tmux: `Esc 5` sent at once reached the app as "∞" (Textual reads
    Esc+digit as macOS's Option-digit), so both keys were lost. Red before: the parser
    gave `infinity`, which nothing splits."""
    read_escape_digits_as_alt()
    parser = XTermParser()
    keys = [*parser.feed("\x1b5"), *parser.feed("")]  # "": the end, as a pause would
    assert [k.key for k in keys if isinstance(k, events.Key)] == ["alt+5"]
    (key,) = keys
    assert isinstance(key, events.Key)
    assert [(k.key, k.character) for k in unmerged(key)] == [("escape", "\x1b"), ("5", "5")]


async def test_a_new_sort_filter_or_search_starts_at_its_first_row(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Found driving: after `s`, a new filter, a search or `e`, the list opened scrolled
    part-way down (the cursor kept its old row), its top rows hidden. Red before."""
    dsn, _ids = fleet
    _more_jobs(dsn, 60)
    app = console(dsn)
    async with app.run_test(size=(120, 24)) as pilot:
        await show(pilot, "3")
        view = app.query_one(JobsView)
        table = view.table
        table.move_cursor(row=30)
        await pilot.press("s")
        await until(pilot, lambda: view.page is not None and view.page.order == view.order)
        await pilot.pause()
        assert table.cursor_row == 0 and table.scroll_y == 0
        table.move_cursor(row=30)
        await pilot.press("/", *"state:queued", "enter")
        await until(pilot, lambda: view.page is not None and view.page.where.state is not None)
        await pilot.pause()
        assert table.cursor_row == 0 and table.scroll_y == 0
        await show(pilot, "6")
        events_view = app.query_one(EventsView)
        events_table: DataTable[Any] = events_view.query_one("#events-table", DataTable)
        events_table.move_cursor(row=15)
        events_view.search(EventQuery(kind="submitted"))
        await until(pilot, lambda: bool(events_view.found))
        await pilot.pause()
        assert events_table.cursor_row == 0 and events_table.scroll_y == 0


async def test_keys_typed_before_a_view_s_number_act_first(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Found driving: `G1` in one burst, then `3`, left the jobs cursor on row 1: the
    view's number, a priority key, switched before the table read its G. Red before."""
    dsn, _ids = fleet
    _more_jobs(dsn, 30)
    app = console(dsn)
    async with app.run_test(size=(120, 24)) as pilot:
        await show(pilot, "3")
        table = app.query_one(JobsView).table
        await pilot.press("g")
        burst(pilot, "G1")
        await until(pilot, lambda: app.current == "overview" and not app.busy)
        await show(pilot, "3")
        assert table.cursor_row == table.row_count - 1


async def test_ctrl_u_in_a_box_keeps_the_text_typed_right_after_it(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Found driving: `/`, Ctrl-U and `state:queued⏎` in one burst filtered nothing: the
    Input's Ctrl-U, a binding, ran after the characters typed after it and deleted them.
    Red before: the filter stayed empty."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        burst(pilot, "/")
        assert app._driver is not None
        event = events.Key("ctrl+u", "\x15")
        event.set_sender(app)
        app._driver.send_message(event)
        burst(pilot, "state:queued\n")
        await until(pilot, lambda: app.where.state == JobState.QUEUED)


# ---- 8: the smaller defects -----------------------------------------------------------


@pytest.fixture
def reader(fleet: tuple[str, dict[str, int]], tmp_path: Path) -> Iterator[str]:
    """A reader login's DSN on the scenario's database (dropped after)."""
    dsn, _ids = fleet
    name = f"fq_reader_{tmp_path.name[-8:].replace('-', '_')}"
    with connect(dsn) as conn:
        roles.add(
            conn,
            roles.Kind.READER,
            "dashboard",
            admin_dsn=dsn,
            password_file=tmp_path / "pgpass",
            login=name,
        )
        conn.commit()
    yield login_dsn(dsn, name)
    with connect(dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", [name]
        )
        roles.remove(conn, name)


async def test_a_reader_login_is_shown_and_offered_no_action(
    fleet: tuple[str, dict[str, int]], reader: str
) -> None:
    """Red before: a reader was shown "acting as root" and offered Cancel and Drain,
    which failed "permission denied for function cancel"."""
    app = console(reader)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        assert "reader login" in app.sub_title and "acting as" not in app.sub_title
        actions = {b.binding.action for b in app.screen.active_bindings.values()}
        assert "cancel_jobs" not in actions
        await show(pilot, "5")
        actions = {b.binding.action for b in app.screen.active_bindings.values()}
        assert not any(a.startswith("runner_state") for a in actions)


async def test_a_reader_s_action_keys_say_why_and_mark_nothing(
    fleet: tuple[str, dict[str, int]], reader: str
) -> None:
    """Found driving: a reader's C and d did nothing, silently, and space and A still
    marked jobs no cancel could follow. Red before: no word, and marks."""
    app = console(reader)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await show(pilot, "3")
        await until(pilot, lambda: "reader login" in app.sub_title)

        def said(what: str) -> bool:
            return any(what in str(n.message) for n in app._notifications)

        await pilot.press("C")
        await until(pilot, lambda: said("may not cancel: it reads only"))
        view = app.query_one(JobsView)
        await pilot.press("space", "A")
        await pilot.pause()
        assert not view.marked
        await show(pilot, "5")
        await pilot.press("d")
        await until(pilot, lambda: said("may not drain, pause and resume"))
        assert not isinstance(app.screen, DrainForm)


async def test_escape_clears_a_jobs_filter_typed_on_the_command_line(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Found driving: `:jobs state:failed` from a job's detail, then Esc, went back to the
    detail with the filter kept; a typed filter is cleared first (the help says so), and
    the next Esc goes back. Red before: the first Esc left the jobs view."""
    dsn, ids = fleet
    app = console(dsn, view="detail", job=JobId(ids["queued0"]))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.loads > 0 and not app.busy)
        await pilot.press(":", *"jobs state:failed", "enter")
        await until(pilot, lambda: app.current == "jobs" and app.where.state == JobState.FAILED)
        await pilot.press("escape")
        await until(pilot, lambda: app.where == JobFilter())
        assert app.current == "jobs"
        await pilot.press("escape")
        await until(pilot, lambda: app.current == "detail")


async def test_mark_all_matching_then_cancel_in_bulk_names_count_and_filter(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: marks stopped at the 500 rows loaded, and 500 cancels were 500 round
    trips. Here the page holds 500 of 520 queued lint jobs; all 520 are cancelled."""
    dsn, _ids = fleet
    with connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO fleetq.jobs (project, operation, commit_sha, lane, capabilities, "
            "memory_mb, cpu_millis, timeout_s, submitted_by, priority_class, state) "
            "SELECT project, operation, commit_sha, lane, capabilities, memory_mb, cpu_millis, "
            "timeout_s, 'bulk', 2, 'queued' FROM fleetq.jobs, generate_series(1, 520) "
            "WHERE state = 'queued' AND operation = 'lint' LIMIT 517"
        )
        (queued,) = conn.execute(
            "SELECT count(*) FROM fleetq.jobs WHERE state = 'queued' AND project = 'tools'"
        ).fetchone()  # type: ignore[misc]
    assert queued == 520
    app = console(dsn)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await show(pilot, "3")
        await pilot.press("slash", *"state:queued project:tools", "enter")
        await until(pilot, lambda: app.where.project == "tools" and not app.busy)
        view = app.query_one(JobsView)
        assert view.page is not None and len(view.page.jobs) == 500
        await pilot.press("A")
        await until(pilot, lambda: len(view.marked) == 520)
        started = max(view.marked)
        with connect(dsn, autocommit=True) as conn:  # one starts after it was marked
            conn.execute(
                "UPDATE fleetq.jobs SET state = 'claimed', lease_owner = 'build-1/r1', "
                "lease_version = 1, lease_expires_at = clock_timestamp() + interval '1 h', "
                "claimed_at = clock_timestamp() WHERE id = $1",
                [started],
            )
        await pilot.press("C")
        await pilot.pause()
        body = str(app.screen.body)  # type: ignore[attr-defined]
        assert "Cancel 520 jobs matching state:queued project:tools" in body
        await pilot.press("y")

        def left() -> int:
            with connect(dsn) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM fleetq.jobs WHERE state = 'queued' AND project = 'tools'"
                ).fetchone()
            assert row is not None
            return int(row[0])

        await until(pilot, lambda: left() == 0, deadline=30)
        assert not view.marked
        # found driving: "cancelled 0 of 0 job(s) ... 8 no longer matched" named none
        said = "cancelled 519 of 520 job(s); 0 stop(s) pending; 1 no longer matched the "
        said += f"filter, left alone (job {started})"
        await until(pilot, lambda: any(said in str(n.message) for n in app._notifications))
        with connect(dsn) as conn:  # marked while queued, claimed since: not cancelled unseen
            (state,) = conn.execute(
                "SELECT state FROM fleetq.jobs WHERE project = 'tools' ORDER BY id DESC LIMIT 1"
            ).fetchone()  # type: ignore[misc]
        assert state == "claimed"


async def test_latest_events_name_runners_apart_from_submitters(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: the "runner" column showed a submitter when no runner was named."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "1")
        recent: DataTable[Any] = app.query_one("#overview-events", DataTable)
        runners = {str(recent.get_cell(r.key, "runner")) for r in recent.ordered_rows}
        assert "ci" not in runners and "release-bot" not in runners


def test_a_full_runner_is_not_counted_as_able_to_claim() -> None:
    """Red before: "3 of 3 can claim now" beside "full"."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    full = _runner(now, lanes={"checks": (2, 2)}, live_jobs=2)
    text = lane_panel("checks", [full], [], now).plain
    assert "0 of 1 runner(s) serving checks can claim now" in text
    assert "full" in text


async def test_the_detail_ticks_and_says_lost_rule_only_while_live(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: "submitted 13.1s ago" never moved, and a succeeded job read "lost 0
    (requeued once, then failed)"."""
    dsn, ids = fleet
    app = console(dsn, job=ids["done"], view="detail")
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "4")
        head = app.query_one("#detail-head", Static)
        assert "requeued once" not in str(head.render())
        before = str(head.render())
        app.db_now = (app.overview.now, app.db_now[1] - 60)  # type: ignore[union-attr,index]
        tick(app)
        await pilot.pause()
        assert str(head.render()) != before


async def test_end_in_the_detail_shows_the_last_event(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: End/G moved the events table's cursor below the screen's edge."""
    dsn, ids = fleet
    app = console(dsn, job=ids["overlap"], view="detail")
    async with app.run_test(size=(100, 30)) as pilot:
        await show(pilot, "4")
        await pilot.press("G")
        await pilot.pause()
        detail = app.query_one(DetailView)
        events: DataTable[Any] = app.query_one("#detail-events", DataTable)
        assert events.cursor_row == events.row_count - 1
        row_y = events.region.y + 1 + events.cursor_row - int(events.scroll_y)
        assert detail.region.y <= row_y < detail.region.bottom, (row_y, detail.region)


async def test_the_jobs_status_counts_the_filter_it_shows(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """The status line names the page's own filter and count."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        await pilot.press("slash", *"state:queued", "enter")
        await until(pilot, lambda: app.where.state == JobState.QUEUED and not app.busy)
        status = str(app.query_one("#jobs-status", Static).render())
        page = app.query_one(JobsView).page
        assert page is not None
        assert status.startswith(f"{len(page.jobs)} of {page.total} jobs (state:queued;")


async def test_held_keys_go_on_a_busy_fleet_and_after_the_limit(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before (found driving the demo in tmux): with a read always due on a busy
    fleet, keys held for a view were released only when another key came, so Esc in a
    job's detail did nothing. A hold now ends when the view shows, or at its limit."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "1")
        app.hold_keys("a target that never gets ready")
        burst(pilot, "5")
        await pilot.pause(0.2)
        assert app.current == "overview"  # held
        await until(pilot, lambda: app.current == "runners", deadline=HOLD_LIMIT_S + 2)
        app.post_message(Hint())
        burst(pilot, "3")  # while a read is in flight and another due
        app.post_message(Hint())
        burst(pilot, "j")
        table = app.query_one(JobsView).table
        # the replayed `j` reaches the table after the hold ends: waited for, not assumed
        await until(
            pilot,
            lambda: app.current == "jobs" and not app.typeahead.holding and table.cursor_row == 1,
        )


async def test_opening_another_job_never_shows_the_last_one_under_its_name(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: on a loaded machine Enter on job B showed job A's detail (head, events)
    for the 2-3 s its read took, so the operator read A as the job they had opened."""
    dsn, ids = fleet
    app = console(dsn, job=ids["done"], view="detail")
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "4")
        view = app.query_one(DetailView)
        await until(pilot, lambda: view.detail is not None)
        head = app.query_one("#detail-head", Static)
        assert f"job {ids['done']} " in str(head.render())
        app.action_view("jobs")
        app.detail_job = JobId(ids["overlap"])  # what Enter on its row does, then:
        app.action_view("detail")  # checked before its read could land
        shown = str(head.render())
        assert f"job {ids['done']} " not in shown and str(ids["overlap"]) in shown, shown
        events: DataTable[Any] = app.query_one("#detail-events", DataTable)
        assert events.row_count == 0
        await until(pilot, lambda: view.detail is not None and view.detail.job.id == ids["overlap"])


async def test_incident_search_finds_a_lease_expiry_behind_thousands_of_newer_events(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: the events view searched only the newest 1,200 events it held, so
    after a 2,000-job submit `/lease_expired` found nothing while `fleetq events` listed
    it. The search runs on the server over the whole history."""
    dsn, ids = fleet
    with connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO fleetq.events (kind, actor) "
            "SELECT 'submitted', 'bulk' FROM generate_series(1, 3000)"
        )
        (newest,) = conn.execute("SELECT max(id) FROM fleetq.events").fetchone()  # type: ignore[misc]
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "6")
        view = app.query_one(EventsView)
        assert all(e.kind != "lease_expired" for e in view.tail)  # beyond what it holds
        await pilot.press("slash", *"lease_expired", "enter")
        await until(pilot, lambda: bool(view.found))
        expired = [e for e in view.found if e.kind == "lease_expired"]
        assert [e.job_id for e in expired] == [ids["overlap"]]
        assert newest - expired[0].id > 1200
        table: DataTable[Any] = app.query_one("#events-table", DataTable)
        assert _row_keys(table) == [str(e.id) for e in view.found]


async def test_alert_jobs_list_each_alert_s_jobs_and_enter_opens_one(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: "N queued job(s) no runner can take" and unconfirmed stops named no
    job, and the panel had none of theirs to open; a job behind two alerts is one row."""
    dsn, ids = fleet
    with connect(dsn, autocommit=True) as conn:  # a runner that could not stop a job
        conn.execute(
            "UPDATE fleetq.runners SET state = 'draining', state_reason = $1 "
            "WHERE id = 'build-1/r1'",
            [f"stop-unconfirmed: job {ids['stopping']}"],
        )
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "1")
        table = app.query_one("#alert-jobs", DataTable)
        rows = {key: str(table.get_row(key)[1]) for key in _row_keys(table)}
        assert rows[str(ids["stopping"])] == "stop pending, stop unconfirmed"
        assert rows[str(ids["unplaceable"])] == "no runner can take it"
        await pilot.press("a")
        table.move_cursor(row=table.get_row_index(str(ids["unplaceable"])))
        await show(pilot, "enter")
        assert (app.current, app.detail_job) == ("detail", ids["unplaceable"])


async def test_h_shows_a_runner_s_hour_with_its_overlaps_and_e_its_events(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: the hour counted no overlaps (edge-1's run of job 2 outlived its lease
    beside build-1's), and `h` had no Pilot test."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "5")
        table = app.query_one(RunnersView).query_one(DataTable)
        table.move_cursor(row=table.get_row_index("edge-1/r1"))
        await pilot.press("h")
        await until(pilot, lambda: isinstance(app.screen, HourSheet))
        sheet = "\n".join(str(w.render()) for w in app.screen.query(Static))
        counts = {
            words[1]: int(words[2])
            for line in sheet.splitlines()
            if len(words := line.split()) > 2 and words[0] == "▲"
        }
        assert counts["overlap"] == 1 and counts["lease_expired"] == 1, sheet
        await pilot.press("e")
        await until(pilot, lambda: app.current == "events" and not app.busy)
        since = scenario.CLOCK - timedelta(hours=1)
        assert app.query_one(EventsView).query_ == EventQuery(runner="edge-1/r1", since=since)


async def test_the_focused_button_says_so_in_its_own_text(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: `[ No ]` was bracketed whatever had the focus, so after Tab to Yes a
    terminal without colour (NO_COLOR) still showed No as the one Enter would press."""
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        table = app.query_one(JobsView).query_one(DataTable)
        table.move_cursor(row=table.get_row_index(str(ids["running"])))
        await pilot.press("C")
        await until(pilot, lambda: isinstance(app.screen.focused, Button))
        yes, no = app.screen.query_one("#yes", Button), app.screen.query_one("#no", Button)
        assert (str(yes.label), str(no.label)) == ("  Yes  ", "[ No ]")
        await pilot.press("tab")
        await until(pilot, lambda: app.screen.focused is yes)
        assert (str(yes.label), str(no.label)) == ("[ Yes ]", "  No  ")


async def test_keys_typed_after_h_and_a_wait_for_what_they_ask(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: `h e` in one burst gave the `e` to the runners view (its events), not
    to the hour sheet; `A C` offered to cancel the row under the cursor alone."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "5")
        table = app.query_one(RunnersView).query_one(DataTable)
        table.move_cursor(row=table.get_row_index("edge-1/r1"))
        burst(pilot, "he")
        await until(pilot, lambda: app.current == "events" and not app.busy)
        assert app.query_one(EventsView).query_.since is not None  # the hour's, via its sheet
        await show(pilot, "3")
        await pilot.press("slash", *"state:queued", "enter")
        await until(pilot, lambda: app.where.state == JobState.QUEUED and not app.busy)
        view = app.query_one(JobsView)
        assert view.page is not None and len(view.page.jobs) > 1
        burst(pilot, "AC")
        await until(pilot, lambda: isinstance(app.screen.focused, Button))
        assert f"{len(view.page.jobs)} jobs" in str(app.screen.body), app.screen.body  # type: ignore[attr-defined]


async def test_an_action_key_acts_on_the_row_the_keys_before_it_moved_to(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: `jC` in one burst offered to cancel the row the j left (C, a priority
    key, read the cursor before the table had read the j), so `jCy` cancelled a job the
    operator had moved away from."""
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        table = app.query_one(JobsView).query_one(DataTable)
        below = str(ids["running"])
        table.move_cursor(row=table.get_row_index(below) - 1)
        burst(pilot, "jC")
        await until(pilot, lambda: isinstance(app.screen.focused, Button))
        assert f"job: {below} " in str(app.screen.body), app.screen.body  # type: ignore[attr-defined]


async def test_a_reason_and_two_enters_in_one_burst_drain(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Red before: the second Enter reached the reason box before the first had moved
    the keyboard to the button, so a third Enter was needed."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "5")
        table = app.query_one(RunnersView).query_one(DataTable)
        table.move_cursor(row=table.get_row_index("build-1/r1"))
        burst(pilot, "ddisk swap\n\n")

        def state() -> tuple[str, str] | None:
            with connect(dsn) as conn:
                row = conn.execute(
                    "SELECT state, state_reason FROM fleetq.runners WHERE id = 'build-1/r1'"
                ).fetchone()
            return (str(row[0]), str(row[1])) if row else None

        await until(pilot, lambda: state() == ("draining", "disk swap"))
        await until(pilot, lambda: not isinstance(app.screen, DrainForm))


def test_a_renewal_racing_its_own_outcome_is_not_an_incident_of_the_hour() -> None:
    """Red before: a healthy runner's hour flagged "▲ stale_self_race", a benign race."""
    at = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    text = hour_text([("stale_self_race", 3, at), ("lease_expired", 1, at)]).plain
    lines = {
        line.split()[1] if line.startswith("▲") else line.split()[0]: line
        for line in text.splitlines()
    }
    assert lines["lease_expired"].startswith("▲")
    assert not lines["stale_self_race"].startswith("▲") and "raced its own outcome" in text


async def test_a_sort_of_a_cut_page_leads_with_the_first_of_the_whole_match(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Found driving: "oldest first" on 1,983 queued jobs led with a job a minute old (the
    newest 500 read, then sorted). Red before: the top row stayed the oldest of the newest
    page, not job 1; the page is now cut in the order on the server."""
    dsn, _ids = fleet
    _more_jobs(dsn, 510)
    with connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT min(id) FROM fleetq.jobs").fetchone()
    assert row is not None
    oldest = str(row[0])
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        view = app.query_one(JobsView)
        status = view.query_one("#jobs-status", Static)
        assert "— first 500 newest first shown" in str(status.render())
        assert oldest not in view.table.rows
        await pilot.press("s")
        await until(pilot, lambda: "first 500 oldest first shown" in str(status.render()))
        assert view.table.ordered_rows[0].key.value == oldest


async def test_r_brings_a_search_up_to_the_newest_events(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Found driving: a runner's events (`h` then `e`) stayed as first read; `r` read the
    live tail again but not the search, so newer events of that runner never showed."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "6")
        view = app.query_one(EventsView)
        view.search_runner("edge-1/r1")
        await until(pilot, lambda: bool(view.found) and not app.busy)
        with connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO fleetq.events (kind, runner_id, actor) "
                "VALUES ('runner_resumed', 'edge-1/r1', 'alice')"
            )
        await pilot.press("r")
        await until(pilot, lambda: view.found[0].kind == "runner_resumed")


def test_a_runner_offline_by_its_silence_says_so_since_its_last_beat() -> None:
    """Found driving: a runner killed -9 read "offline  - · - · 6m14s ago": no reason,
    and the time of its registration, not of its last heartbeat."""
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    killed = _runner(
        now,
        offline=True,
        state_changed_at=now - timedelta(minutes=6, seconds=14),
        last_heartbeat_at=now - timedelta(seconds=36),
    )
    why = str(runner_cells(killed, now)[[k for k, _ in RUNNER_COLUMNS].index("why")])
    assert why == "no heartbeat (row says active) · 36.0s ago", why
