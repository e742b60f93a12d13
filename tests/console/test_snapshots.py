"""How each view looks, on the deterministic scenario (fixed ids, pinned clock).

Regenerate after an intended change with `uv run pytest tests/console/test_snapshots.py
--snapshot-update` and look at the SVGs before committing them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from textual.pilot import Pilot

from fleetq.console.app import ConsoleApp
from fleetq.console.dialogs import DrainForm
from fleetq.console.views.jobs import JobsView
from fleetq.console.views.runners import RunnersView
from tests.console.conftest import SIZE, console, show, until

Steps = Callable[[Pilot[None]], Awaitable[None]]


def _view(key: str) -> Steps:
    async def steps(pilot: Pilot[None]) -> None:
        await show(pilot, key)

    return steps


async def _confirm_cancel(pilot: Pilot[None]) -> None:
    await show(pilot, "3")
    table = pilot.app.query_one(JobsView).table
    table.move_cursor(row=table.get_row_index("8"))
    await pilot.press("space", "space", "C")
    await pilot.pause()


async def _drain(pilot: Pilot[None]) -> None:
    await show(pilot, "5")
    table = pilot.app.query_one(RunnersView).query_one("DataTable")
    table.move_cursor(row=table.get_row_index("build-1/r1"))  # type: ignore[attr-defined]
    await pilot.press("d")
    await until(pilot, lambda: isinstance(pilot.app.screen, DrainForm))
    await pilot.press(*"disk swap")
    await pilot.pause()


async def _help(pilot: Pilot[None]) -> None:
    await show(pilot, "1")
    await pilot.press("question_mark")
    await pilot.pause()


CASES: dict[str, tuple[dict[str, Any], Steps]] = {
    "overview": ({}, _view("1")),
    "lanes": ({}, _view("2")),
    "jobs": ({}, _view("3")),
    "detail_overlap": ({"job": 2, "view": "detail"}, _view("4")),
    "detail_unplaceable": ({"job": 3, "view": "detail"}, _view("4")),
    "runners": ({}, _view("5")),
    "events": ({}, _view("6")),
    "overlaps": ({}, _view("7")),
    "schedules": ({}, _view("8")),
    "confirm_cancel": ({}, _confirm_cancel),
    "drain": ({}, _drain),
    "help": ({}, _help),
}


def app_for(dsn: str, case: str) -> ConsoleApp:
    """The app for one named case (also used by scripts/screenshots.py)."""
    options, _steps = CASES[case]
    return console(dsn, **options)


@pytest.mark.parametrize("case", list(CASES))
def test_snapshot(case: str, fleet: tuple[str, dict[str, int]], snap_compare: Any) -> None:
    dsn, ids = fleet
    assert (ids["overlap"], ids["unplaceable"], ids["queued2"]) == (2, 3, 8)  # fixed ids
    _options, steps = CASES[case]
    assert snap_compare(app_for(dsn, case), terminal_size=SIZE, run_before=steps)


# At 80x24 and without colour (issue 45): not in CASES, so scripts/screenshots.py (which
# shoots at SIZE) keeps to the full-size views.
SMALL: dict[str, tuple[dict[str, Any], Steps]] = {
    "overview": ({}, _view("1")),
    "jobs": ({}, _view("3")),
    "runners": ({}, _view("5")),
    "help": ({}, _help),
}


@pytest.mark.parametrize("case", list(SMALL))
def test_snapshot_80x24(case: str, fleet: tuple[str, dict[str, int]], snap_compare: Any) -> None:
    dsn, _ids = fleet
    options, steps = SMALL[case]
    assert snap_compare(console(dsn, **options), terminal_size=(80, 24), run_before=steps)


@pytest.mark.parametrize("case", ["overview", "confirm_cancel", "jobs"])
def test_snapshot_no_color(
    case: str,
    fleet: tuple[str, dict[str, int]],
    snap_compare: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dsn, _ids = fleet
    monkeypatch.setenv("NO_COLOR", "1")
    _options, steps = CASES[case]
    assert snap_compare(app_for(dsn, case), terminal_size=SIZE, run_before=steps)
