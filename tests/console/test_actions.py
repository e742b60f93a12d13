"""Keyboard actions write through fleetq.core, after a confirmation, as the operator."""

from __future__ import annotations

from typing import Any

from textual.widgets import DataTable, Static

from fleetq.console.dialogs import Confirm, DrainForm, ReasonForm
from fleetq.console.views.jobs import JobsView
from fleetq.console.views.runners import RunnersView
from fleetq.core.db import connect
from fleetq.core.models import JobId
from tests.console.conftest import SIZE, console, show, until


def _job(dsn: str, job: int) -> tuple[str, str | None]:
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT state, cancelled_by FROM fleetq.jobs WHERE id = $1", [job]
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def _runner(dsn: str, runner: str) -> tuple[str, str | None, str | None]:
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT state, state_reason, state_actor FROM fleetq.runners WHERE id = $1", [runner]
        ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def _cursor_to(app: object, table_owner: type, key: str) -> None:
    table = app.query_one(table_owner).query_one("DataTable")  # type: ignore[attr-defined]
    table.move_cursor(row=table.get_row_index(key))


async def test_cancel_with_C_and_y_cancels_the_job_and_updates_the_row(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, ids = fleet
    running = ids["running"]
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        _cursor_to(app, JobsView, str(running))
        assert "cancel_jobs" in {b.binding.action for b in app.screen.active_bindings.values()}
        await pilot.press("C")
        await pilot.pause()
        assert isinstance(app.screen, Confirm)
        assert app.screen.focused is not None and app.screen.focused.id == "no"
        body = str(app.screen.body)
        assert f"Cancel 1 job: {running} — runners will be asked to stop them" in body
        before = app.loads
        await pilot.press("y")
        await until(pilot, lambda: app.loads > before and not app.busy)
        assert _job(dsn, running) == ("cancelled", "operator")
        table = app.query_one(JobsView).table
        assert str(table.get_cell(str(running), "state")) == "cancelled (stop pending)"
        assert table.cursor_row == table.get_row_index(str(running))  # cursor kept its row


async def test_marked_jobs_are_cancelled_together(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        _cursor_to(app, JobsView, str(ids["queued2"]))
        await pilot.press("space", "space")
        await pilot.press("C")
        await pilot.pause()
        assert isinstance(app.screen, Confirm)
        assert f"Cancel 2 jobs: {ids['queued1']}, {ids['queued2']}" in str(app.screen.body)
        await pilot.press("enter")  # Enter presses the focused button: No
        await pilot.pause()
        assert not isinstance(app.screen, Confirm)
        assert _job(dsn, ids["queued1"])[0] == "queued"
        await pilot.press("C")
        await pilot.pause()
        await pilot.press("tab", "enter")  # Tab to Yes, Enter presses it
        await until(pilot, lambda: _job(dsn, ids["queued1"])[0] == "cancelled")
        assert _job(dsn, ids["queued2"]) == ("cancelled", "operator")
        assert _job(dsn, ids["queued0"])[0] == "queued"
        assert app.query_one(JobsView).marked == set()  # done with: marks do not linger


async def test_n_and_escape_change_nothing(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        _cursor_to(app, JobsView, str(ids["queued0"]))
        for answer in ("n", "escape"):
            await pilot.press("C")
            await pilot.pause()
            assert isinstance(app.screen, Confirm)
            await pilot.press(answer)
            await pilot.pause()
            assert not isinstance(app.screen, Confirm)
        assert _job(dsn, ids["queued0"]) == ("queued", None)


async def test_drain_writes_state_reason_and_actor_after_a_preview(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "5")
        _cursor_to(app, RunnersView, "build-1/r1")
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, DrainForm))
        form = app.screen
        assert isinstance(form, DrainForm)
        preview = {job: answer for job, _state, answer in form.preview}
        # what build-1 runs finishes there; the queued lint jobs can run on gpu-1
        assert preview[ids["running"]].startswith("finishes here; eligible with room elsewhere")
        assert preview[ids["queued0"]] == "can run on gpu-1/r1"
        # typed into the reason; Enter there moves to Drain, and Enter on it drains
        await pilot.press(*"disk swap", "enter", "enter")
        await until(pilot, lambda: _runner(dsn, "build-1/r1")[0] == "draining")
        assert _runner(dsn, "build-1/r1") == ("draining", "disk swap", "operator")


async def test_pause_takes_a_reason_and_resume_asks(fleet: tuple[str, dict[str, int]]) -> None:
    """Found driving: the help said pause takes a reason, the dialog was a yes/no, and a
    reason typed as the help says answered it ('n' of "maint window": No) and leaked
    the rest into the view (its 'd' opened a drain). Red before: no reason form."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "5")
        _cursor_to(app, RunnersView, "gpu-1/r1")
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, ReasonForm))
        effect = str(app.screen.query(Static)[1].render())
        assert effect.startswith("It claims nothing new until resumed"), effect  # not "It it"
        await pilot.press(*"maint window", "enter", "enter")
        await until(pilot, lambda: _runner(dsn, "gpu-1/r1")[0] == "paused")
        assert _runner(dsn, "gpu-1/r1") == ("paused", "maint window", "operator")
        assert not isinstance(app.screen, DrainForm | ReasonForm)
        await pilot.press("u", "y")
        await until(pilot, lambda: _runner(dsn, "gpu-1/r1")[0] == "active")
        assert _runner(dsn, "gpu-1/r1")[2] == "operator"


async def test_readonly_hides_and_refuses_every_action(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, ids = fleet
    app = console(dsn, readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        _cursor_to(app, JobsView, str(ids["queued0"]))
        shown = {b.binding.action for b in app.screen.active_bindings.values()}
        assert not shown & {"cancel_jobs", "runner_state('draining')"}
        await pilot.press("C", "y")
        await pilot.pause()
        await show(pilot, "5")
        _cursor_to(app, RunnersView, "gpu-1/r1")
        await pilot.press("d", "p", "y", "u", "y")
        await pilot.pause()
        assert not isinstance(app.screen, Confirm | DrainForm)
        assert "read-only" in app.sub_title
    assert _job(dsn, ids["queued0"]) == ("queued", None)
    assert _runner(dsn, "gpu-1/r1") == ("active", None, None)


async def test_a_reason_with_markup_is_recorded_and_shown_literally(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """The typed reason comes back in a toast: it must not be parsed as markup (`[/]`
    used to end the app with a MarkupError)."""
    dsn, _ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await show(pilot, "5")
        _cursor_to(app, RunnersView, "gpu-1/r1")
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, DrainForm))
        await pilot.press(*"[/] [bold]INC-42", "enter", "enter")
        await until(pilot, lambda: _runner(dsn, "gpu-1/r1")[0] in ("draining", "drained"))
        await pilot.pause(0.2)
        assert app.is_running
        assert _runner(dsn, "gpu-1/r1")[1] == "[/] [bold]INC-42"


async def test_finished_jobs_are_not_offered_for_cancel(fleet: tuple[str, dict[str, int]]) -> None:
    dsn, ids = fleet
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "3")
        _cursor_to(app, JobsView, str(ids["done"]))
        await pilot.press("C")
        await pilot.pause()
        assert not isinstance(app.screen, Confirm)  # "nothing to cancel: job 1 is succeeded"
        view = app.query_one(JobsView)
        view.marked = {JobId(ids["done"]), JobId(ids["queued0"])}
        await pilot.press("C")
        await pilot.pause()
        assert isinstance(app.screen, Confirm)
        body = str(app.screen.body)
        assert f"Cancel 1 job: {ids['queued0']} —" in body and "Skipping 1 finished." in body
        await pilot.press("n")


def _schedule(dsn: str, name: str) -> tuple[object, ...]:
    with connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT paused_at IS NOT NULL, paused_reason, paused_by FROM fleetq.schedules "
            "WHERE name = $1",
            [name],
        ).fetchone()
    assert row is not None
    return tuple(row)


async def test_the_schedules_view_pauses_with_a_reason_resumes_and_opens_the_last_job(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, ids = fleet  # the scenario's nightly fired queued0; its hourly is paused
    app = console(dsn)
    async with app.run_test(size=SIZE) as pilot:
        await show(pilot, "8")
        table: DataTable[Any] = app.query_one("#schedules-table", DataTable)
        rows = {str(table.get_cell(r.key, "name")): r.key for r in table.ordered_rows}
        assert set(rows) == {"hourly", "nightly"}
        assert str(table.get_cell(rows["hourly"], "commit")) == "head of main"
        assert str(table.get_cell(rows["nightly"], "last")).startswith(f"job {ids['queued0']}")
        assert str(table.get_cell(rows["hourly"], "last")) == "never"
        assert "paused by ops: repository moving" in str(table.get_cell(rows["hourly"], "next"))
        assert "next tick" not in str(table.get_cell(rows["nightly"], "next"))
        # the next 02:00 in Berlin after the pinned clock (12:00 UTC, 29 Nov): 01:00 UTC
        assert "(in 13h00m)" in str(table.get_cell(rows["nightly"], "next"))
        table.move_cursor(row=table.get_row_index(rows["nightly"]))
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, ReasonForm))
        app.screen.set_focus(app.screen.query_one("#yes"))
        await pilot.press("enter")  # a reason is required: the form stays
        assert isinstance(app.screen, ReasonForm)
        await pilot.press(*"repo move", "enter", "enter")
        await until(pilot, lambda: _schedule(dsn, "nightly")[0] is True)
        assert _schedule(dsn, "nightly") == (True, "repo move", "operator")
        await show(pilot, "r")
        assert "paused by operator: repo move" in str(table.get_cell(rows["nightly"], "next"))
        await pilot.press("u")
        await until(pilot, lambda: isinstance(app.screen, Confirm))
        await pilot.press("y")
        await until(pilot, lambda: _schedule(dsn, "nightly")[0] is False)
        await show(pilot, "r")
        table.move_cursor(row=table.get_row_index(rows["nightly"]))
        await pilot.press("enter")
        await until(pilot, lambda: app.current == "detail")
        assert app.detail_job == ids["queued0"]


async def test_a_job_that_ended_before_the_cancel_reached_it_is_named(
    fleet: tuple[str, dict[str, int]],
) -> None:
    """Found driving: a job that ended while the dialog was open came back "cancelled 0 of
    1 job(s)" and nothing more. Red before: the toast did not say the job had ended."""
    dsn, ids = fleet
    queued = ids["queued0"]
    app = console(dsn)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await show(pilot, "3")
        _cursor_to(app, JobsView, str(queued))
        await pilot.press("C")
        await until(pilot, lambda: isinstance(app.screen, Confirm))
        with connect(dsn, autocommit=True) as conn:  # someone else was quicker
            conn.execute("SELECT fleetq.cancel($1, 'bob', 'dup')", [queued])
        await pilot.press("y")

        def said() -> list[str]:
            return [str(n.message) for n in app._notifications]

        await until(pilot, lambda: any("cancelled 0 of 1" in m for m in said()))
        assert any(f"1 had already ended (job {queued} cancelled)" in m for m in said()), said()
