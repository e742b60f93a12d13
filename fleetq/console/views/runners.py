"""View 5, runners: capacity, heartbeat age, state with who set it and why."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable

from fleetq.console.dialogs import HourSheet
from fleetq.console.messages import DrillDown, Heartbeats, RunnerHour
from fleetq.console.text import age, bar, one_line, plain, state
from fleetq.console.views.table import Cell, Change, Table, selected_key, sync, visible_keys
from fleetq.core.models import Runner, RunnerState
from fleetq.core.views import Heartbeat

# what a runner can take first (a narrow terminal cuts from the right; the table
# scrolls sideways to the rest)
COLUMNS = (
    ("runner", "runner"),
    ("state", "state"),
    ("heartbeat", "heartbeat"),
    ("jobs", "jobs"),
    ("lanes", "lanes used/slots"),
    ("memory", "memory MB reserved/total"),
    ("cpu", "CPUs reserved"),
    ("why", "state reason · actor · since"),
    ("caps", "capabilities"),
    ("stale", "stale rejections"),
    ("node", "node"),
)


class RunnersView(Vertical):
    """Every runner, one row each; `d`/`p`/`u` act on the selected one; Enter lists its
    jobs, `e` its events."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("h", "hour", "Its last hour", priority=True),  # `h e`: the e is the sheet's
        Binding("e", "events", "Its events"),
    ]

    class HourAsked(Message):
        """The operator asked for a runner's last hour (`h`)."""

        def __init__(self, runner: str) -> None:
            super().__init__()
            self.runner = runner

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.runners: list[Runner] = []

    def compose(self) -> ComposeResult:
        yield Table(id="runners-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table: DataTable[Cell] = self.query_one("#runners-table", DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key)

    @on(DataTable.RowSelected, "#runners-table")
    def _jobs(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.post_message(DrillDown(runner=event.row_key.value))

    def action_hour(self) -> None:
        """`h`: the selected runner's hour, once the keys typed before it moved the
        cursor (`jh`); the keys after it (`h e`) wait for its sheet, which lets them go."""

        def ask() -> None:
            if (runner := self.selected()) is not None:
                self.post_message(self.HourAsked(runner))
            else:
                self.app.release_keys()  # type: ignore[attr-defined]

        self.app.after_keys("the runner's hour", ask, released=False)  # type: ignore[attr-defined]

    @on(Heartbeats)
    def _beats(self, message: Heartbeats) -> None:
        self.beat(message.beats, message.now)

    @on(RunnerHour)
    def _hour(self, message: RunnerHour) -> None:
        """The runner's hour in a sheet; `e` there lists those events."""

        def chosen(events: bool | None) -> None:
            if events:
                since = message.at - timedelta(hours=1)
                self.post_message(DrillDown(runner=message.runner, events=True, since=since))

        self.app.push_screen(HourSheet(message.runner, message.kinds), chosen)

    def action_events(self) -> None:
        if (runner := self.selected()) is not None:
            self.post_message(DrillDown(runner=runner, events=True))

    def state_of(self, runner: str) -> RunnerState | None:
        """The runner's state as last read (None: offline or unknown)."""
        found = next((r for r in self.runners if r.id == runner), None)
        return None if found is None or found.offline else found.state

    def selected(self) -> str | None:
        """The runner under the cursor."""
        return selected_key(self.query_one("#runners-table", DataTable))

    def show(self, runners: list[Runner], now: datetime) -> None:
        """Put the runners on screen, by key."""
        self.runners = runners
        sync(
            self.query_one("#runners-table", DataTable),
            [(r.id, runner_cells(r, now)) for r in runners],
        )

    def tick(self, now: datetime) -> None:
        """Redraw heartbeat ages of the rows on screen (those that changed)."""
        table = self.query_one("#runners-table", Table)
        by_id: dict[str, Runner] = {r.id: r for r in self.runners}
        changes: list[Change] = []
        for key in visible_keys(table):
            if (runner := by_id.get(key)) is not None:
                beat = _heartbeat(runner, now)
                if table.get_cell(key, "heartbeat") != beat:
                    changes.append((key, "heartbeat", beat))
        table.update_cells(changes)

    def beat(self, beats: list[Heartbeat], now: datetime) -> None:
        """Fresh heartbeats (read once a second): the ages say how long ago, truly."""
        self.runners = with_beats(self.runners, beats)
        self.tick(now)


def with_beats(runners: list[Runner], beats: list[Heartbeat]) -> list[Runner]:
    """`runners` with their last heartbeat (and offline flag) from `beats`."""
    by_id = {b.id: b for b in beats}
    return [
        r.model_copy(update={"last_heartbeat_at": b.last_heartbeat_at, "offline": b.offline})
        if (b := by_id.get(r.id)) is not None
        else r
        for r in runners
    ]


def runner_cells(r: Runner, now: datetime) -> list[Cell]:
    lanes = ", ".join(f"{lane} {used}/{slots}" for lane, (slots, used) in sorted(r.lanes.items()))
    shown = "offline" if r.offline else r.state.value
    why = Text()
    if r.offline and r.state != RunnerState.OFFLINE:
        # offline by its silence, not by its row (killed, cut off): since its last beat
        why.append(f"no heartbeat (row says {r.state.value})")
        why.append(f" · {age(r.last_heartbeat_at, now)} ago", style="dim")
    else:
        why.append(plain(one_line(r.state_reason or "-", 48)))
        why.append(" · ")
        why.append(plain(r.state_actor or "-"))
        why.append(f" · {age(r.state_changed_at, now)} ago", style="dim")
    cells: dict[str, Cell] = {
        "runner": plain(r.id, "bold"),
        "node": plain(r.node),
        "state": state(shown),
        "heartbeat": _heartbeat(r, now),
        "jobs": str(r.live_jobs),
        "lanes": plain(lanes),
        "memory": bar(r.reserved_memory_mb, r.memory_mb),
        "cpu": f"{r.reserved_cpu_millis / 1000:g}/{r.cpu_millis / 1000:g}",
        "caps": plain(", ".join(r.capabilities) or "-"),
        "stale": Text(str(r.stale_rejections), style="bold red" if r.stale_rejections else ""),
        "why": why,
    }
    return [cells[key] for key, _label in COLUMNS]


def _heartbeat(r: Runner, now: datetime) -> Text:
    return Text(age(r.last_heartbeat_at, now) + " ago", style="red" if r.offline else "")
