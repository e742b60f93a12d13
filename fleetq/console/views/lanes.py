"""View 2, lanes: depth by state, running against slots, eligible runners, oldest wait."""

from __future__ import annotations

from datetime import datetime

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable

from fleetq.console.messages import DrillDown
from fleetq.console.text import age, bar, plain
from fleetq.console.views.table import Cell, Table, sync
from fleetq.core.views import LaneRow, Overview

COLUMNS = (
    "lane",
    "queued",
    "claimed",
    "running",
    "stop pending",
    "slots in use",
    "runners",
    "eligible runners",
    "oldest wait",
)


class LanesView(Vertical):
    """Every lane, one row each."""

    def compose(self) -> ComposeResult:
        yield Table(id="lanes-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table: DataTable[Cell] = self.query_one("#lanes-table", DataTable)
        for name in COLUMNS:
            table.add_column(name, key=name)

    @on(DataTable.RowSelected, "#lanes-table")
    def _jobs(self, event: DataTable.RowSelected) -> None:
        """Enter: the lane's jobs (queued first in its reasons: who could take them)."""
        if event.row_key.value is not None:
            self.post_message(DrillDown(lane=event.row_key.value))

    def show(self, overview: Overview, now: datetime) -> None:
        """Put the lanes on screen."""
        show_lanes(self.query_one("#lanes-table", DataTable), overview.lanes, now, COLUMNS)


def show_lanes(
    table: DataTable[Cell], lanes: list[LaneRow], now: datetime, columns: tuple[str, ...]
) -> None:
    """Lanes as rows of `table`, in the named `columns` (the overview shows a few)."""

    def cells(lane: LaneRow) -> list[Cell]:
        every: dict[str, Cell] = {
            "lane": plain(lane.lane, "bold"),
            "queued": str(lane.queued),
            "claimed": str(lane.claimed),
            "running": str(lane.running),
            "stop pending": str(lane.stop_pending),
            "slots in use": bar(lane.slots_used, lane.slots),
            "runners": str(lane.runners),
            "eligible runners": str(lane.eligible_runners),
            "oldest wait": age(lane.oldest_queued_at, now),
        }
        return [every[name] for name in columns]

    sync(table, [(lane.lane, cells(lane)) for lane in lanes])
