"""View 7, overlaps: every window in which two executions of one job were alive at once,
open and closed, newest first (the overview only warns about open ones, and a closed
window used to vanish with its warning)."""

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
from fleetq.core.stats import Overlap

COLUMNS = (
    ("job", "job"),
    ("tokens", "tokens"),
    ("older", "older run on"),
    ("newer", "newer run on"),
    ("started", "from"),
    ("length", "length"),
    ("ended", "how it ended"),
)


def key(window: Overlap) -> str:
    return f"{window.job_id}:{window.older_token}:{window.newer_token}"


def ending(window: Overlap) -> Text:
    """Open, or how the window closed and how sure its end is."""
    if window.open:
        return Text("OPEN: both may still run", style="bold red")
    if not window.end_measured:
        text = Text("possible, at most this long: ", style="yellow")
        text.append(plain(window.unseen()))
        return text
    text = Text("end confirmed" if window.end_confirmed else "end recorded")
    text.append(", measured")
    if window.older_stop_reason:
        text.append(f"; t{window.older_token} ")
        text.append(plain(window.older_stop_reason))
    return text


class OverlapsView(Vertical):
    """Overlap windows; Enter opens the job."""

    DEFAULT_CSS = """
    OverlapsView #overlaps-status { height: 1; padding: 0 1; color: $text-muted; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.windows: list[Overlap] = []

    def compose(self) -> ComposeResult:
        yield Static(id="overlaps-status")
        yield Table(id="overlaps-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table: DataTable[Cell] = self.query_one("#overlaps-table", DataTable)
        for name, label in COLUMNS:
            table.add_column(label, key=name)

    def show(self, windows: list[Overlap], now: datetime) -> None:
        """Put the windows on screen, newest first."""
        self.windows = windows
        still = sum(w.open for w in windows)
        possible = sum(not w.happened for w in windows)
        status = Text(f"{len(windows) - possible} overlap window(s)")
        if still:
            status.append(f", {still} still open", style="bold red")
        if possible:
            status.append(f", {possible} possible (an end not seen: at most)", style="yellow")
        if not windows:
            status = Text("no two executions of one job have ever run at once", style="green")
        else:
            status.append("; Enter opens the job (its lease timeline shows the window)")
        self.query_one("#overlaps-status", Static).update(status)
        sync(
            self.query_one("#overlaps-table", DataTable),
            [self._row(w, now) for w in reversed(windows)],
        )

    def _row(self, w: Overlap, now: datetime) -> Row:
        length = duration(w.seconds(now))
        return (
            key(w),
            [
                str(w.job_id),
                f"t{w.older_token}∥t{w.newer_token}",
                plain(w.older_runner),
                plain(w.newer_runner),
                w.started_at.astimezone().strftime("%H:%M:%S"),
                Text(length if w.end_measured or w.open else f"≤{length}"),
                ending(w),
            ],
        )

    @on(DataTable.RowSelected, "#overlaps-table")
    def _open(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.post_message(OpenJob(JobId(int(event.row_key.value.split(":")[0]))))
