"""View 2, lanes: depth by state, running against slots, eligible runners, oldest wait."""

from __future__ import annotations

from datetime import datetime

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable

from fleetq.console.text import age, bar, plain
from fleetq.console.views.table import Cell, sync
from fleetq.core.views import Overview

COLUMNS = (
    "lane",
    "queued",
    "claimed",
    "running",
    "stop pending",
    "running/slots",
    "runners",
    "eligible runners",
    "oldest wait",
)


class LanesView(Vertical):
    """Every lane, one row each."""

    def compose(self) -> ComposeResult:
        yield DataTable(id="lanes-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table: DataTable[Cell] = self.query_one("#lanes-table", DataTable)
        for name in COLUMNS:
            table.add_column(name, key=name)

    def show(self, overview: Overview, now: datetime) -> None:
        """Put the lanes on screen."""
        table: DataTable[Cell] = self.query_one("#lanes-table", DataTable)
        sync(
            table,
            [
                (
                    lane.lane,
                    [
                        plain(lane.lane, "bold"),
                        str(lane.queued),
                        str(lane.claimed),
                        str(lane.running),
                        str(lane.stop_pending),
                        bar(lane.running + lane.claimed, lane.slots),
                        str(lane.runners),
                        str(lane.eligible_runners),
                        age(lane.oldest_queued_at, now),
                    ],
                )
                for lane in overview.lanes
            ],
        )
