"""View 6, events: a live tail of the history, filterable by any word in a row."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import DataTable, Input, Static

from fleetq.console.messages import OpenJob
from fleetq.console.text import plain
from fleetq.console.views.detail import event_row
from fleetq.console.views.table import Cell, Table, selected_key
from fleetq.core.models import Event, JobId

KEEP = 2000  # events kept in the tail


class EventsView(Vertical):
    """The newest events at the top; `/` filters (every word must match)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter"),
        Binding("escape", "escape", "Clear filter / back", show=False),
    ]
    DEFAULT_CSS = """
    EventsView #events-filter { display: none; }
    EventsView.filtering #events-filter { display: block; }
    EventsView #events-status { height: 1; padding: 0 1; color: $text-muted; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.tail: deque[Event] = deque(maxlen=KEEP)
        self.words: list[str] = []
        self._dirty = False
        self.seen: set[int] = set()

    def compose(self) -> ComposeResult:
        yield Input(
            placeholder="words to match, e.g. lease_expired node-a  (empty: all)",
            id="events-filter",
        )
        yield Static(id="events-status")
        yield Table(id="events-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table: DataTable[Cell] = self.query_one("#events-table", DataTable)
        for name in ("id", "at", "kind", "job", "token", "runner", "actor", "detail"):
            table.add_column(name, key=name)

    def reset(self, events: Iterable[Event], *, draw: bool = True) -> None:
        """Replace the tail (first load and resync)."""
        self.tail.clear()
        self._add(list(events))
        self._dirty = True
        if draw:
            self.draw()

    def extend(self, events: list[Event], *, draw: bool = True) -> None:
        """Add events not seen yet (late commits included), newest at the top; drawn now
        only when the view is on screen. The cursor stays on its event."""
        fresh = [e for e in events if e.id not in self.seen]
        if not fresh:
            return
        evicted = self._add(fresh)
        if not draw or self._dirty:
            self._dirty = True
            if draw:
                self.draw()
            return
        table: DataTable[Cell] = self.query_one("#events-table", DataTable)
        cursor = selected_key(table)
        for event_id in evicted:
            if str(event_id) in table.rows:
                table.remove_row(str(event_id))
        for event in fresh:
            if self._matches(event):
                key, cells = event_row(event)
                table.add_row(*cells, key=key)
        table.sort("id", key=lambda v: -int(str(v)))  # newest first
        if cursor is not None and cursor in table.rows:
            table.move_cursor(row=table.get_row_index(cursor), scroll=False)
        self._status()

    def _add(self, events: list[Event]) -> list[int]:
        """Keep `events` in the tail (in id order, at most KEEP); returns evicted ids."""
        merged = sorted([*self.tail, *events], key=lambda e: e.id)
        evicted = [e.id for e in merged[: max(0, len(merged) - KEEP)]]
        self.tail.clear()
        self.tail.extend(merged[-KEEP:])
        self.seen = {e.id for e in self.tail}
        return evicted

    def draw(self) -> None:
        """Redraw the table from the tail, if it changed while hidden."""
        if self._dirty:
            self._redraw()

    def _matches(self, event: Event) -> bool:
        _, cells = event_row(event)
        line = " ".join(str(c) for c in cells).lower()
        return all(w in line for w in self.words)

    def _redraw(self) -> None:
        self._dirty = False
        table: DataTable[Cell] = self.query_one("#events-table", DataTable)
        cursor = selected_key(table)
        table.clear()
        for event in reversed(self.tail):
            if self._matches(event):
                key, cells = event_row(event)
                table.add_row(*cells, key=key)
        if cursor is not None and cursor in table.rows:
            table.move_cursor(row=table.get_row_index(cursor), scroll=False)
        self._status()

    def _status(self) -> None:
        """How many rows, under which filter, and a word when nothing matches."""
        shown = self.query_one("#events-table", DataTable).row_count
        status = Text(f"{shown} of the newest {len(self.tail)} events")
        if self.words:
            status.append(" matching ")
            status.append(plain(" ".join(self.words), "bold"))
            status.append(" (/ changes, Esc clears)")
            if not shown:
                status = Text("no event matches ")
                status.append(plain(" ".join(self.words), "bold"))
                status.append(f" among the newest {len(self.tail)} (Esc clears the filter)")
        elif not shown:
            status = Text("no event yet")
        status.append("; Enter opens an event's job")
        self.query_one("#events-status", Static).update(status)

    def action_escape(self) -> None:
        """Close the filter box, else clear the filter, else go back."""
        if self.has_class("filtering"):
            self.remove_class("filtering")
            self.query_one("#events-table", DataTable).focus()
        elif self.words:
            self.words = []
            self._redraw()
        else:
            self.app.action_go_back()  # type: ignore[attr-defined]

    @on(DataTable.RowSelected, "#events-table")
    def _open(self, event: DataTable.RowSelected) -> None:
        found = next((e for e in self.tail if str(e.id) == event.row_key.value), None)
        if found is not None and found.job_id is not None:
            self.post_message(OpenJob(JobId(found.job_id)))

    def filter_words(self, words: list[str]) -> None:
        """Show only events matching every word (a drill-down sets them)."""
        self.words = [w.lower() for w in words]
        self._dirty = True

    def action_filter(self) -> None:
        self.add_class("filtering")
        box = self.query_one("#events-filter", Input)
        box.value = " ".join(self.words)
        box.focus()

    @on(Input.Submitted, "#events-filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        self.words = event.value.lower().split()
        self.remove_class("filtering")
        self._redraw()
        self.query_one("#events-table", DataTable).focus()
