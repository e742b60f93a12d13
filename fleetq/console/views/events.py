"""View 6, events: a live tail of the history, and incident search over all of it."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import ClassVar

from pydantic import ValidationError
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Input, Static

from fleetq.console.box import Box
from fleetq.console.messages import OpenJob, Searched
from fleetq.console.text import escape, plain
from fleetq.console.typeahead import focus_now
from fleetq.console.views.detail import event_row
from fleetq.console.views.table import Cell, Table, selected_key, sync
from fleetq.core.models import Event, JobId
from fleetq.core.views import EventQuery

KEEP = 2000  # events kept in the tail
SEARCH_KEYS = ("runner", "job", "kind", "since", "until")


def parse_search(text: str, now: datetime) -> EventQuery:
    """`runner:node-a/r1 job:61 kind:lease_expired since:30m until:12:05` (any subset); a
    bare word is a job id (digits), a runner (with a /) or a kind. Times are minutes or
    hours ago (`30m`, `2h`) or a clock time today (`12:05`)."""
    fields: dict[str, object] = {}
    for word in text.split():
        key, sep, value = word.partition(":")
        if not sep or key not in SEARCH_KEYS:
            key, value = ("job" if word.isdigit() else "runner" if "/" in word else "kind"), word
        if key in ("since", "until"):
            fields[key] = _when(value, now)
        else:
            fields[key] = value
    return EventQuery.model_validate(fields)


def describe_search(query: EventQuery) -> str:
    """The search as the operator would type it."""
    parts = [f"{k}:{getattr(query, k)}" for k in ("runner", "job", "kind") if getattr(query, k)]
    parts += [f"{k}:{getattr(query, k):%H:%M:%S}" for k in ("since", "until") if getattr(query, k)]
    return " ".join(parts)


def _when(value: str, now: datetime) -> datetime:
    if value[:-1].isdigit() and value[-1] in "mh":
        minutes = int(value[:-1]) * (60 if value[-1] == "h" else 1)
        return now - timedelta(minutes=minutes)
    try:
        clock = datetime.strptime(value, "%H:%M").time()
    except ValueError:
        raise ValueError(f"{value!r}: a time is 30m, 2h or 12:05") from None
    return datetime.combine(now.date(), clock, tzinfo=now.tzinfo)


class EventsView(Vertical):
    """The newest events at the top, live; `/` searches the whole history on the server
    (by runner, job, kind, time range), a page at a time (`n` reads older ones)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Search", priority=True),
        Binding("n", "more", "Older", show=False),
        Binding("escape", "escape", "Clear search / back", show=False),
        Binding("r", "reload", "Reload", show=False),
    ]
    DEFAULT_CSS = """
    EventsView #events-filter { display: none; }
    EventsView.filtering #events-filter { display: block; }
    EventsView #events-status { height: 1; padding: 0 1; color: $text-muted; }
    """

    class Search(Message):
        """Read a page of `query`'s events below the id `below` (None: the newest)."""

        def __init__(self, query: EventQuery, below: int | None) -> None:
            super().__init__()
            self.query = query
            self.below = below

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """`/` is a priority key (it acts before the keys typed after it); inside a box
        it is only a slash."""
        if action == "filter":
            return not isinstance(self.app.focused, Input)
        return True

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.tail: deque[Event] = deque(maxlen=KEEP)
        self.query_: EventQuery = EventQuery()  # empty: the live tail
        self.found: list[Event] = []  # the search's pages so far, newest first
        self.more = False
        self._dirty = False
        self.seen: set[int] = set()

    def compose(self) -> ComposeResult:
        yield Box(
            placeholder="runner:node-a/r1 job:61 kind:lease_expired since:30m until:12:05, "
            "or a bare job id, runner or kind  (empty: the live tail)",
            id="events-filter",
        )
        yield Static(id="events-status")
        yield Table(id="events-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table: DataTable[Cell] = self.query_one("#events-table", DataTable)
        for name in ("id", "at", "kind", "job", "token", "runner", "actor", "detail"):
            table.add_column(name, key=name)

    @property
    def searching(self) -> bool:
        """A search's results are shown, not the live tail."""
        return not self.query_.empty

    def reset(self, events: Iterable[Event], *, draw: bool = True) -> None:
        """Replace the tail (first load and resync); nothing is redrawn when the tail
        holds the same events (an idle resync costs no redraw)."""
        events = list(events)
        if [e.id for e in events[-KEEP:]] == [e.id for e in self.tail]:
            return
        self.tail.clear()
        self._add(events)
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
        if not draw or self._dirty or self.searching:
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
        if self._dirty and not self.searching:
            self._redraw(list(reversed(self.tail)))

    def _redraw(self, events: list[Event]) -> None:
        self._dirty = False
        table: DataTable[Cell] = self.query_one("#events-table", DataTable)
        sync(table, [event_row(e) for e in events])
        self._status()

    def _status(self) -> None:
        """How many rows, from the tail or which search, and what the keys do."""
        shown = self.query_one("#events-table", DataTable).row_count
        if self.searching:
            newest = f"the newest {shown:,} events" if self.more else f"{shown:,} event(s)"
            status = Text(f"{newest} matching " if shown else "no event matches ")
            status.append(plain(describe_search(self.query_), "bold"))
            status.append(" in the whole history")
            status.append("; n reads older ones" if self.more else "; no older one")
            status.append(" (/ changes, Esc clears)")
        elif shown:
            status = Text(f"{shown:,} of the newest {len(self.tail):,} events, live")
            status.append(" (/ searches the whole history)")
        else:
            status = Text("no event yet")
        status.append("; Enter opens an event's job")
        self.query_one("#events-status", Static).update(status)

    def action_escape(self) -> None:
        """Close the search box, else clear the search, else go back."""
        if self.has_class("filtering"):
            self.remove_class("filtering")
            focus_now(self.query_one("#events-table", DataTable))
        elif self.searching:
            self.query_ = EventQuery()
            self._redraw(list(reversed(self.tail)))
            self.query_one("#events-table", Table).action_first_row()
        else:
            self.app.action_go_back()  # type: ignore[attr-defined]

    @on(DataTable.RowSelected, "#events-table")
    def _open(self, event: DataTable.RowSelected) -> None:
        pool = self.found if self.searching else self.tail
        found = next((e for e in pool if str(e.id) == event.row_key.value), None)
        if found is not None and found.job_id is not None:
            self.post_message(OpenJob(JobId(found.job_id)))

    def search(self, query: EventQuery) -> None:
        """Search the history for `query` (a drill-down or `/`); empty: the live tail."""
        self.query_ = query
        self.found = []
        if query.empty:
            self._redraw(list(reversed(self.tail)))
            self.query_one("#events-table", Table).action_first_row()
        else:
            self.post_message(self.Search(query, None))

    def search_runner(self, runner: str, since: datetime | None = None) -> None:
        """A runner's events (`e` on the runners view), optionally since a time."""
        self.search(EventQuery(runner=runner, since=since))

    def show_found(self, events: list[Event], *, first: bool, more: bool) -> None:
        """A page of the search: the first replaces, the next ones add older rows."""
        self.found = events if first else [*self.found, *events]
        self.more = more
        self._redraw(self.found)
        if first:
            self.query_one("#events-table", Table).action_first_row()

    @on(Searched)
    def _found(self, message: Searched) -> None:
        if self.searching:
            self.show_found(message.events, first=message.first, more=message.more)

    def action_reload(self) -> None:
        """r: read everything again, a search's first page included (a search is read
        once, not followed: `r` brings it up to the newest events)."""
        if self.searching:
            self.search(self.query_)
        self.app.action_reload()  # type: ignore[attr-defined]

    def action_more(self) -> None:
        """n: the next, older page of the search."""
        if self.searching and self.more and self.found:
            self.post_message(self.Search(self.query_, self.found[-1].id))

    def action_filter(self) -> None:
        self.add_class("filtering")
        box = self.query_one("#events-filter", Input)
        box.value = describe_search(self.query_)
        box.cursor_position = len(box.value)
        focus_now(box)

    @on(Input.Submitted, "#events-filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        try:
            query = parse_search(event.value, datetime.now().astimezone())
        except (ValueError, ValidationError) as exc:
            self.notify(escape(str(exc).splitlines()[0]), title="search", severity="error")
            return
        self.remove_class("filtering")
        focus_now(self.query_one("#events-table", DataTable))
        self.search(query)
