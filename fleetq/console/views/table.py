"""Update a DataTable by key, so the cursor stays on the same row while data moves."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

from rich.cells import cell_len
from rich.text import Text, TextType
from textual.binding import Binding, BindingType
from textual.cache import LRUCache
from textual.widgets import DataTable
from textual.widgets.data_table import CellDoesNotExist, ColumnKey, RowKey

from fleetq.console.text import escape

Cell = Text | str
Row = tuple[str, Sequence[Cell]]
Change = tuple[RowKey | str, ColumnKey | str, Cell]  # a cell's row, column, new value


def literal(cell: Cell) -> Cell:
    """A cell as DataTable should draw it: a `str` (which DataTable would parse as Rich
    markup) becomes plain, escaped `Text`; `Text` the views built is theirs."""
    return Text(escape(cell)) if isinstance(cell, str) else cell


class Table(DataTable[Cell]):
    """A DataTable with the movement keys of k9s, less and vi: j/k, g/Home to the first
    row, G/End to the last (DataTable's own Home and End scrolled sideways). Its cells
    are never markup: a `[` in a name is a `[` (`literal`)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("g,home", "first_row", "First row", show=False),
        Binding("G,end", "last_row", "Last row", show=False),
    ]

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        """Measure new rows (DataTable does it when idle), then forget every line drawn
        before: DataTable keeps drawn lines until its next change, so a header drawn
        between a row's arrival and its measure kept the old column widths while the rows
        came out at the new ones, until a resize redrew it (test_table.py)."""
        super()._update_dimensions(new_rows)
        self._clear_caches()

    def add_row(
        self,
        *cells: Cell,
        height: int | None = 1,
        key: str | None = None,
        label: TextType | None = None,
    ) -> RowKey:
        return super().add_row(*map(literal, cells), height=height, key=key, label=label)

    def update_cell(
        self,
        row_key: RowKey | str,
        column_key: ColumnKey | str,
        value: Cell,
        *,
        update_width: bool = False,
    ) -> None:
        if update_width:  # a column grows: the whole table is laid out again anyway
            super().update_cell(row_key, column_key, literal(value), update_width=True)
        else:
            self.update_cells([(row_key, column_key, value)])

    def update_cells(self, changes: Iterable[Change]) -> None:
        """Rewrite cells that keep their column's width, drawing again only their rows.

        DataTable's own `update_cell` counts a change of the whole table, which every
        cache of drawn cells and lines is keyed by, so one clock ticking in one column
        drew every visible cell again each second (the jobs view at rest took 8 % of a
        core at 160x48). Here only the changed rows' cached renderings are dropped."""
        cells: set[tuple[RowKey, ColumnKey]] = set()
        for row_key, column_key, value in changes:
            row = RowKey(row_key) if isinstance(row_key, str) else row_key
            column = ColumnKey(column_key) if isinstance(column_key, str) else column_key
            if row not in self._row_locations or column not in self._column_locations:
                raise CellDoesNotExist(f"no cell at row {row.value!r}, column {column.value!r}")
            self._data[row][column] = literal(value)
            cells.add((row, column))
        if cells:
            self._forget_cells(cells)

    def _forget_cells(self, cells: set[tuple[RowKey, ColumnKey]]) -> None:
        """Drop what DataTable drew of `cells` and of their rows' lines, and ask for those
        rows alone to be drawn again: a row's other cells keep their drawings (a runner's
        row drew its eleven cells again each second for one ticking age)."""
        rows = {row for row, _ in cells}
        indices = {self._row_locations.get(row) for row in rows}
        _discard(self._row_renderable_cache, lambda key: key[1] in indices)
        _discard(self._cell_render_cache, lambda key: (key[0], key[1]) in cells)
        _discard(self._row_render_cache, lambda key: key[0] in rows)
        _discard(self._line_cache, lambda key: self._line_row(key[0]) in rows)
        for index in indices:
            if index is not None:
                self.refresh_row(index)

    def _line_row(self, y: int) -> RowKey | None:
        try:
            return self._get_offsets(y)[0]
        except (LookupError, IndexError):
            return None

    def action_first_row(self) -> None:
        """g; and where a new listing (another sort, filter or search) starts: kept on its
        old row, the cursor held the view scrolled part-way down, its top rows hidden."""
        if self.row_count:
            self.move_cursor(row=0)
        self.scroll_home(animate=False)

    def action_last_row(self) -> None:
        if self.row_count:
            self.move_cursor(row=self.row_count - 1)
        self.scroll_end(animate=False, x_axis=False)


def _discard(cache: LRUCache[Any, Any], stale: Callable[[Any], bool]) -> None:
    for key in [key for key in cache.keys() if stale(key)]:  # noqa: SIM118 - no __iter__
        cache.discard(key)


def sync(table: DataTable[Cell], rows: Sequence[Row]) -> None:
    """Make `table` show `rows` (key, cells) in order, keeping the cursor on its key.

    When the keys are unchanged only changed cells are rewritten; otherwise the table is
    rebuilt and the cursor moved back to the row it was on (or kept at its index when that
    row left). A table without a cursor keeps its scroll position instead."""
    keys = [key for key, _ in rows]
    current = [row.key.value for row in table.ordered_rows]
    if keys == current:
        columns = list(table.columns.items())
        changes: list[Change] = []
        for key, cells in rows:
            old = table.get_row(key)
            for (column, spec), before, shown in zip(columns, old, cells, strict=False):
                after = literal(shown) if isinstance(table, Table) else shown
                if before == after:
                    continue
                # Re-measuring a column is costly (a relayout): only when it must grow.
                if spec.auto_width and _width(after) > spec.content_width:
                    table.update_cell(key, column, after, update_width=True)
                elif isinstance(table, Table):
                    changes.append((key, column, after))
                else:
                    table.update_cell(key, column, after)
        if changes:
            assert isinstance(table, Table)
            table.update_cells(changes)
        return
    cursor_key = _cursor_key(table)
    cursor_row = table.cursor_row
    scroll_y = table.scroll_y
    table.clear()
    for key, cells in rows:
        table.add_row(*cells, key=key)
    if table.cursor_type == "none":
        table.scroll_to(y=scroll_y, animate=False)
        return  # no cursor to keep (following the old top row's key scrolled a tail away)
    row = min(cursor_row, len(rows) - 1)
    if cursor_key is not None and cursor_key in keys:
        row = keys.index(cursor_key)
    if rows:
        table.move_cursor(row=row, scroll=False)
    table.scroll_to(y=showing(table, row, scroll_y), animate=False)


def showing(table: DataTable[Cell], row: int, top: float) -> float:
    """A scroll position that keeps `top` if row `row` is on screen there, else one
    that puts the row on screen: after a sort, a filter or a refresh, Enter must never
    open a row the operator cannot see."""
    height = max(1, table.scrollable_content_region.height - table.header_height)
    if top <= row < top + height:
        return top
    return float(max(0, row - height // 2))


def _cursor_key(table: DataTable[Cell]) -> str | None:
    if not table.row_count:
        return None
    try:
        key: RowKey = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
    except Exception:
        return None
    return key.value


def selected_key(table: DataTable[Cell]) -> str | None:
    """The key of the row under the cursor."""
    return _cursor_key(table)


def visible_keys(table: DataTable[Cell]) -> list[str]:
    """Keys of the rows on screen now (for the 1 s tick: only those are redrawn)."""
    first = int(table.scroll_y)
    height = max(1, table.size.height - 1)
    keys = [row.key.value for row in table.ordered_rows]  # display order, sorted or not
    return [k for k in keys[first : first + height] if k is not None]


def _width(cell: Cell) -> int:
    return cell.cell_len if isinstance(cell, Text) else cell_len(cell)
