"""`sync` updates a DataTable by key: cells change in place, columns grow when a value
gets wider, and a rebuild keeps the cursor on its row."""

from __future__ import annotations

from typing import Any

from textual.app import App, ComposeResult
from textual.widgets import DataTable

from fleetq.console.views.table import sync


class _Table(App[None]):
    def compose(self) -> ComposeResult:
        table: DataTable[Any] = DataTable()
        table.add_column("name", key="name")
        table.add_column("verdict", key="verdict")
        yield table


async def test_cells_change_in_place_and_columns_grow() -> None:
    app = _Table()
    async with app.run_test() as pilot:
        table: DataTable[Any] = app.query_one(DataTable)
        sync(table, [("a", ["a", "ok"]), ("b", ["b", "ok"])])
        await pilot.pause()
        narrow = table.columns["verdict"].content_width  # type: ignore[index]
        sync(table, [("a", ["a", "ok"]), ("b", ["b", "no capacity now: 2/2 slots in use"])])
        await pilot.pause()
        assert table.get_cell("b", "verdict") == "no capacity now: 2/2 slots in use"
        assert table.columns["verdict"].content_width > narrow  # type: ignore[index]


async def test_a_rebuild_keeps_the_cursor_on_its_row() -> None:
    app = _Table()
    async with app.run_test() as pilot:
        table: DataTable[Any] = app.query_one(DataTable)
        sync(table, [(k, [k, ""]) for k in ("c", "b", "a")])
        table.move_cursor(row=1)  # on "b"
        sync(table, [(k, [k, ""]) for k in ("e", "d", "c", "b", "a")])  # two new at the top
        await pilot.pause()
        assert table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value == "b"
        sync(table, [(k, [k, ""]) for k in ("e", "d", "c", "a")])  # "b" left: index kept
        await pilot.pause()
        assert table.cursor_row == 3
