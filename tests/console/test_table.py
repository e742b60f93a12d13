"""`sync` updates a DataTable by key: cells change in place, columns grow when a value
gets wider, and a rebuild keeps the cursor on its row."""

from __future__ import annotations

from typing import Any

from textual import events
from textual.app import App, ComposeResult
from textual.widgets import DataTable

from fleetq.console.views.table import Table, sync


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


class _Ours(App[None]):
    def compose(self) -> ComposeResult:
        table = Table()
        table.add_column("job", key="job")
        table.add_column("from", key="from")
        table.add_column("how it ended", key="ended")
        yield table


async def test_the_header_is_drawn_to_the_widths_of_the_rows_added_since() -> None:
    """DataTable measures new rows when it is next idle, and keeps each line it draws
    until its next change. A header drawn between the two kept its old widths while the
    rows drawn after came out at the new ones (the overlaps view's snapshot caught `from`
    too narrow for its times, out of line with its row) until a resize redrew it."""
    app = _Ours()
    async with app.run_test(size=(80, 10)) as pilot:
        table = app.query_one(Table)
        await pilot.pause()
        table.add_row("2", "11:59:02", "end confirmed, measured", key="2")
        table.render_line(0)  # a repaint before the idle that measures the row
        await table._on_idle(events.Idle())  # the measure, before its resize is handled
        header, row = table.render_line(0).text, table.render_line(1).text
    assert header.index("how it ended") == row.index("end confirmed"), (header, row)


async def test_a_changed_cell_draws_its_row_again_and_no_other() -> None:
    """DataTable's own update_cell counts a change of the whole table: a clock ticking in
    one column drew every visible row again each second (8 % of a core at rest in the
    jobs view). A cell that keeps its width draws its own row again, and only that."""
    app = _Ours()
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.query_one(Table)
        sync(table, [(str(n), [str(n), f"11:59:{n:02}", "running"]) for n in range(20)])
        await pilot.pause()
        drawn: list[int] = []
        compute = table._compute_row_renderables

        def counted(row_index: int) -> Any:
            drawn.append(row_index)
            return compute(row_index)

        table._compute_row_renderables = counted  # type: ignore[method-assign]
        sync(table, [(str(n), [str(n), f"11:59:{n:02}", "running"]) for n in range(20)])
        ages = [(str(n), [str(n), f"11:59:{n:02}", "running"]) for n in range(20)]
        ages[7] = ("7", ["7", "11:59:07", "stopped"])
        sync(table, ages)
        await pilot.pause()
        assert set(drawn) == {7}, drawn
        assert "stopped" in table.render_line(8).text  # the header is line 0
        assert "running" in table.render_line(9).text


async def test_a_changed_cell_is_drawn_again_and_its_row_s_other_cells_are_not() -> None:
    """A runner's row drew its eleven cells again each second for its one ticking age
    (a tenth of the console's idle CPU in the runners view). Red before: the row's other
    cells lost their drawings too."""
    app = _Ours()
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.query_one(Table)
        sync(table, [(str(n), [str(n), f"11:59:{n:02}", "running"]) for n in range(5)])
        await pilot.pause()

        def drawn(row: str, column: str) -> bool:
            return any(
                (key[0].value, key[1].value) == (row, column)
                for key in table._cell_render_cache.keys()  # noqa: SIM118 - no __iter__
            )

        assert drawn("3", "job") and drawn("3", "ended")
        table.update_cells([("3", "ended", "stopped")])
        assert drawn("3", "job") and drawn("3", "from") and not drawn("3", "ended")
        await pilot.pause()
        assert drawn("3", "ended") and "stopped" in table.render_line(4).text
