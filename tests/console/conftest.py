"""Console tests drive the real app (Pilot) against a real database holding the
deterministic scenario."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from textual.pilot import Pilot

from fleetq.console.app import ConsoleApp
from fleetq.core.db import connect
from tests.console import scenario

SIZE = (160, 48)


@pytest.fixture
def fleet(db_dsn: str) -> tuple[str, dict[str, int]]:
    """A database with the scenario in it: (dsn, job ids by name)."""
    with connect(db_dsn, autocommit=True) as conn:
        ids = scenario.build(conn)
    return db_dsn, ids


def console(dsn: str, **options: object) -> ConsoleApp:
    """The app on the pinned clock, not following NOTIFY unless asked."""
    settings: dict[str, object] = {"clock": scenario.CLOCK, "live": False, "actor": "operator"}
    settings.update(options)
    return ConsoleApp(dsn, **settings)  # type: ignore[arg-type]


async def until(pilot: Pilot[None], check: Callable[[], bool], *, deadline: float = 10.0) -> float:
    """Let the app run until `check()` holds; returns the seconds it took."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > deadline:
            raise AssertionError(f"condition not met within {deadline}s")
        await pilot.pause(0.02)
    return time.monotonic() - start


async def settled(pilot: Pilot[None], before: int) -> None:
    """Wait until the app has put a read on screen after `before` and none is due."""
    app = pilot.app
    assert isinstance(app, ConsoleApp)
    await until(pilot, lambda: app.loads > before and not app.busy)
    await pilot.pause()


async def show(pilot: Pilot[None], *keys: str) -> None:
    """Press keys (a view key, an action) and wait for the read they cause."""
    app = pilot.app
    assert isinstance(app, ConsoleApp)
    await until(pilot, lambda: app.ready and not app.busy)
    before = app.loads
    await pilot.press(*keys)
    await settled(pilot, before)
