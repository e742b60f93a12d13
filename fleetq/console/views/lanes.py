"""View 2, lanes: depth by state, running against slots, eligible runners, oldest wait,
and for the highlighted lane its runners (who could take its work now, and why the
others could not) and its queue history by priority class."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TypeVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import DataTable, Static

from fleetq.console.messages import DrillDown
from fleetq.console.text import age, bar, duration, plain, sparkline, state
from fleetq.console.views.table import Cell, Table, selected_key, sync
from fleetq.core.models import Runner, RunnerState
from fleetq.core.views import HISTORY_MINUTES, LaneHistory, LaneRow, Overview

N = TypeVar("N", int, float)
HISTORY = f"queued, {HISTORY_MINUTES} min"
# the backlog first (depth, wait, its hour), so a 100-column terminal cuts off only what
# the lane's panel below shows anyway
COLUMNS = (
    "lane",
    "queued",
    "oldest wait",
    HISTORY,
    "claimed",
    "running",
    "stop pending",
    "slots in use",
    "runners",
    "eligible runners",
)
WIDE = 97  # panel width from which the history shows a column a minute (else two)


class LanesView(Vertical):
    """Every lane, one row each, and the highlighted lane's runners and history."""

    DEFAULT_CSS = """
    LanesView #lanes-table { height: auto; max-height: 50%; }
    LanesView #lane-panel { height: 1fr; border: round $primary-darken-2; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.overview: Overview | None = None

    def compose(self) -> ComposeResult:
        yield Table(id="lanes-table", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="lane-panel"):
            yield Static(id="lane-detail")

    def on_mount(self) -> None:
        table: DataTable[Cell] = self.query_one("#lanes-table", DataTable)
        for name in COLUMNS:
            table.add_column(name, key=name)

    @on(DataTable.RowSelected, "#lanes-table")
    def _jobs(self, event: DataTable.RowSelected) -> None:
        """Enter: the lane's jobs (queued first in its reasons: who could take them)."""
        if event.row_key.value is not None:
            self.post_message(DrillDown(lane=event.row_key.value))

    @on(DataTable.RowHighlighted, "#lanes-table")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_panel()

    def on_resize(self) -> None:
        self._show_panel()  # a column a minute, or two, follows the width

    def show(self, overview: Overview, now: datetime) -> None:
        """Put the lanes on screen."""
        self.overview = overview
        show_lanes(self.query_one("#lanes-table", DataTable), overview, now, COLUMNS)
        self._show_panel()

    def _show_panel(self) -> None:
        overview = self.overview
        lane = selected_key(self.query_one("#lanes-table", DataTable))
        panel = self.query_one("#lane-panel", VerticalScroll)
        if overview is None or lane is None:
            return
        if not panel.content_size.width:
            return  # not laid out yet (or hidden): on_resize draws it
        panel.border_title = f"lane {lane}: its runners, and its queue by class"
        self.query_one("#lane-detail", Static).update(
            lane_panel(
                lane,
                overview.runners,
                overview.lane_history(lane),
                overview.now,
                per_minute=panel.content_size.width >= WIDE,
            )
        )


def show_lanes(
    table: DataTable[Cell], overview: Overview, now: datetime, columns: tuple[str, ...]
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
            HISTORY: Text(sparkline(halved(overview.queued_history(lane.lane))), "yellow"),
        }
        return [every[name] for name in columns]

    sync(table, [(lane.lane, cells(lane)) for lane in overview.lanes])


def halved(values: Sequence[N | None]) -> list[N | None]:
    """Two minutes per column (the higher one), so an hour fits a table cell."""
    pairs = zip(values[::2], values[1::2], strict=False)
    return [a if b is None else b if a is None else max(a, b) for a, b in pairs]


def lane_panel(
    lane: str,
    runners: list[Runner],
    history: list[LaneHistory],
    now: datetime,
    *,
    per_minute: bool = True,
) -> Text:
    """Who serves `lane` and whether each could claim its work now; then the lane's
    queue depth and wait per priority class, a column a minute (or two when narrow)."""
    text = Text()
    serving = [r for r in runners if lane in r.lanes]
    eligible = [r for r in serving if _takes_work(r, lane)]
    text.append(f"{len(eligible)} of {len(serving)} runner(s) serving {lane} can claim now", "bold")
    text.append("  (a job's own needs: its detail, 4)\n", "dim")
    for runner in sorted(serving, key=lambda r: (not _takes_work(r, lane), r.id)):
        slots, used = runner.lanes[lane]
        takes = _takes_work(runner, lane)
        text.append("  ✓ " if takes else "  ✗ ", "green" if takes else "red")
        text.append_text(plain(runner.id, "bold"))
        text.append("  ")
        text.append_text(state("offline" if runner.offline else runner.state.value))
        text.append(
            f"  slots {used}/{slots}, free {runner.memory_mb - runner.reserved_memory_mb} MB, "
            f"{(runner.cpu_millis - runner.reserved_cpu_millis) / 1000:g} CPUs  "
        )
        text.append_text(plain(_why_not(runner, slots, used, now), "dim"))
        text.append("\n")
    if not serving:
        text.append("  no runner serves this lane: its jobs wait for one\n", "red")
    column = "a column a minute" if per_minute else "a column two minutes"
    text.append(f"\nqueue, last {HISTORY_MINUTES} min ", "bold")
    text.append(f"({column}; blank: not sampled, no runner ran)\n", "dim")
    shown = [h for h in history if h.active]
    for h in shown:
        depth = [v for v in h.queued if v is not None]
        waits = [v for v in h.wait_p50_s if v is not None]
        queued = h.queued if per_minute else halved(h.queued)
        waited = h.wait_p50_s if per_minute else halved(h.wait_p50_s)
        text.append(f"  class {h.priority_class} queued ", "bold")
        text.append(sparkline(queued), "yellow")
        text.append(f"  now {depth[-1] if depth else '-'} · peak {max(depth, default=0)}\n")
        text.append("    wait p50     ", "bold")
        text.append(sparkline(waited), "cyan")
        text.append(
            f"  {duration(waits[-1]) if waits else '-'} · peak "
            f"{duration(max(waits)) if waits else '-'}\n"
        )
    if not shown:
        text.append("  nothing queued or claimed in the window\n", "dim")
    text.rstrip()
    return text


def _takes_work(runner: Runner, lane: str) -> bool:
    """Active, heartbeating, and a slot of `lane` free: a full runner cannot claim now."""
    slots, used = runner.lanes[lane]
    return runner.state == RunnerState.ACTIVE and not runner.offline and used < slots


def _why_not(runner: Runner, slots: int, used: int, now: datetime) -> str:
    """Why this runner would not claim the lane's next job now ('' when it would)."""
    if runner.offline:
        return f"no heartbeat for {age(runner.last_heartbeat_at, now)}"
    if runner.state != RunnerState.ACTIVE:
        reason = f": {runner.state_reason}" if runner.state_reason else ""
        return f"{runner.state.value}{reason}"
    if used >= slots:
        return "full: claims when a slot frees"
    return ""
