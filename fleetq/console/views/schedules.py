"""View 8, schedules: each schedule of the fleet file, its next tick and its last job;
p pauses the highlighted one (with a reason), u resumes it, Enter opens its last job."""

from __future__ import annotations

from datetime import datetime

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from fleetq.console.messages import OpenJob
from fleetq.console.text import duration, plain
from fleetq.console.views.table import Cell, Row, Table, sync
from fleetq.core.models import JobId
from fleetq.core.schedules import Listed

COLUMNS = (
    ("name", "schedule"),
    ("cron", "cron"),
    ("job", "submits"),
    ("commit", "commit"),
    ("next", "next tick"),
    ("last", "last fired"),
    ("catch_up", "catch-up"),
)


class SchedulesView(Vertical):
    """The schedules; Enter opens the last job a schedule fired."""

    DEFAULT_CSS = """
    SchedulesView #schedules-status { height: 1; padding: 0 1; color: $text-muted; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.schedules: list[Listed] = []

    def compose(self) -> ComposeResult:
        yield Static(id="schedules-status")
        yield Table(id="schedules-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table: DataTable[Cell] = self.query_one("#schedules-table", DataTable)
        for name, label in COLUMNS:
            table.add_column(label, key=name)

    def show(self, schedules: list[Listed], now: datetime) -> None:
        """Put the schedules on screen, by name."""
        self.schedules = schedules
        paused = sum(s.paused_at is not None for s in schedules)
        if not schedules:
            status = Text("no schedule: add [schedules.NAME] to the fleet file and apply it")
        else:
            status = Text(f"{len(schedules)} schedule(s)")
            if paused:
                status.append(f", {paused} paused", style="bold yellow")
            status.append("; p pause (with a reason), u resume, Enter opens the last job")
        self.query_one("#schedules-status", Static).update(status)
        sync(
            self.query_one("#schedules-table", DataTable),
            [self._row(s, now) for s in schedules],
        )

    def selected(self) -> Listed | None:
        """The schedule under the cursor."""
        table: DataTable[Cell] = self.query_one("#schedules-table", DataTable)
        if not self.schedules or table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((s for s in self.schedules if s.name == key), None)

    def _row(self, s: Listed, now: datetime) -> Row:
        if s.paused_at is not None:
            upcoming = Text("paused by ", style="yellow")
            upcoming.append(plain(s.paused_by or "?"))
            upcoming.append(": ")
            upcoming.append(plain(s.paused_reason or ""))
        elif s.next_tick is not None:
            wait = duration((s.next_tick - now).total_seconds())
            upcoming = Text(f"{s.next_tick.astimezone():%a %H:%M} (in {wait})")
        else:
            upcoming = Text("-")
        last = (
            Text(f"job {s.last_job}, {duration((now - s.last_fired).total_seconds())} ago")
            if s.last_job is not None and s.last_fired is not None
            else Text("never", style="dim")
        )
        return (
            s.name,
            [
                plain(s.name),
                plain(f"{s.cron} ({s.timezone})"),
                plain(f"{s.project}/{s.operation}"),
                plain(s.commit_sha[:12] if s.commit_sha else f"head of {s.branch}"),
                upcoming,
                last,
                s.catch_up,
            ],
        )

    @on(DataTable.RowSelected, "#schedules-table")
    def _open(self, event: DataTable.RowSelected) -> None:
        chosen = next((s for s in self.schedules if s.name == event.row_key.value), None)
        if chosen is not None and chosen.last_job is not None:
            self.post_message(OpenJob(JobId(chosen.last_job)))
