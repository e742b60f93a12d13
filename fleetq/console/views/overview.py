"""View 1, the overview: lanes at a glance, queue wait, throughput, runners, alerts."""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Static

from fleetq.console.text import STATE_STYLES, age, duration, escape, plain, sparkline, state
from fleetq.console.views.lanes import HISTORY, show_lanes
from fleetq.console.views.table import Cell, Table, sync
from fleetq.core.models import Event
from fleetq.core.views import THROUGHPUT_BUCKET_S, Overview

LANE_COLUMNS = ("lane", "queued", "claimed", "running", "slots in use", "oldest wait", HISTORY)


def alert_strip(overview: Overview, now: datetime) -> Text:
    """One line per thing that needs the operator, or a quiet 'all clear'."""
    alerts = overview.alerts
    if alerts.quiet:
        return Text("✓ all clear: no offline runner, no overlap, no pending stop", style="green")
    text = Text()
    if alerts.offline_runners:
        names = ", ".join(alerts.offline_runners[:4])
        more = f" +{len(alerts.offline_runners) - 4}" if len(alerts.offline_runners) > 4 else ""
        text.append(f"▲ {len(alerts.offline_runners)} runner(s) offline: ", style="bold red")
        text.append(plain(f"{names}{more}"))
        text.append("\n")
    for window in alerts.open_overlaps[:3]:
        text.append("▲ open overlap: ", style="bold red")
        text.append(
            f"job {window.job_id} runs twice (t{window.older_token} on "
            f"{escape(window.older_runner)}, t{window.newer_token} on "
            f"{escape(window.newer_runner)}) "
            f"for {duration(window.seconds(now))}\n"
        )
    if alerts.stops_pending:
        text.append(f"▲ {alerts.stops_pending} stop(s) pending", style="bold yellow")
        text.append(": cancelled, the runner has not confirmed the process is gone\n")
    if alerts.stops_unconfirmed:
        text.append(f"▲ {alerts.stops_unconfirmed} stop(s) unconfirmed", style="bold red")
        text.append(": a runner could not stop a job and drained itself\n")
    if alerts.unplaceable:
        text.append(f"▲ {alerts.unplaceable} queued job(s) no runner can take", style="bold red")
        text.append(" (even with all capacity free): see `4` on one of them\n")
    text.rstrip()
    return text


def stale_strip(since: datetime, why: str) -> Text:
    """While the console cannot read, the alerts are unknown: never 'all clear'."""
    text = Text(f"▲ not connected since {since:%H:%M:%S}", style="bold red")
    text.append(plain(f" ({why})" if why else ""))
    text.append(": alerts unknown; what is shown is the last read")
    return text


class OverviewView(Vertical):
    """The fleet at a glance."""

    DEFAULT_CSS = """
    OverviewView #alerts { padding: 0 1; margin-bottom: 1; border: round $warning; height: auto; }
    OverviewView #overview-lanes { height: auto; max-height: 12; }
    OverviewView #figures { height: auto; }
    OverviewView #below { height: 1fr; }
    OverviewView #below DataTable { width: 1fr; height: 1fr; border: round $primary-darken-2; }
    OverviewView .panel { width: 1fr; padding: 0 1; border: round $primary-darken-2; height: auto; }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="alerts")
        table: DataTable[Cell] = Table(id="overview-lanes", cursor_type="row", zebra_stripes=True)
        table.border_title = "lanes"
        yield table
        with Horizontal(id="figures"):
            yield Static(id="waits", classes="panel")
            yield Static(id="throughput", classes="panel")
            yield Static(id="fleet", classes="panel")
        with Horizontal(id="below"):
            runners: DataTable[Cell] = Table(id="overview-runners", cursor_type="none")
            runners.border_title = "runners"
            yield runners
            recent: DataTable[Cell] = Table(id="overview-events", cursor_type="none")
            recent.border_title = "latest events"
            yield recent

    def on_mount(self) -> None:
        table: DataTable[Cell] = self.query_one("#overview-lanes", DataTable)
        for name in LANE_COLUMNS:
            table.add_column(name, key=name)
        self.query_one("#waits", Static).border_title = "queue wait, last 15 min"
        self.query_one("#throughput", Static).border_title = "finished per minute, last 30 min"
        self.query_one("#fleet", Static).border_title = "runners by state"
        runners: DataTable[Cell] = self.query_one("#overview-runners", DataTable)
        for name in ("runner", "state", "heartbeat", "jobs", "lanes (used/slots)"):
            runners.add_column(name, key=name)
        recent: DataTable[Cell] = self.query_one("#overview-events", DataTable)
        for name in ("at", "kind", "job", "token", "runner"):
            recent.add_column(name, key=name)

    def stale(self, since: datetime, why: str) -> None:
        """The console lost the database: say so where 'all clear' would be."""
        self.query_one("#alerts", Static).update(stale_strip(since, why))

    def show(self, overview: Overview, now: datetime, recent: list[Event]) -> None:
        """Put a fresh overview (and the newest events, newest first) on screen."""
        self.query_one("#alerts", Static).update(alert_strip(overview, now))
        show_lanes(self.query_one("#overview-lanes", DataTable), overview, now, LANE_COLUMNS)
        waits = Text()
        for w in overview.waits:
            waits.append(f"class {w.priority_class}  ", style="bold")
            waits.append(f"p50 {duration(w.p50_s)}  p95 {duration(w.p95_s)}  ({w.jobs} jobs)\n")
        if not overview.waits:
            waits.append("no job claimed in the window", style="dim")
        self.query_one("#waits", Static).update(waits)
        total = sum(overview.throughput)
        spark = Text(sparkline(overview.throughput), style="green")
        spark.append(
            f"\n{total} finished, {overview.throughput[-1] if overview.throughput else 0} "
            f"in the last {THROUGHPUT_BUCKET_S}s bucket"
        )
        self.query_one("#throughput", Static).update(spark)
        counts = Counter("offline" if r.offline else r.state.value for r in overview.runners)
        fleet = Text()
        for name in ("active", "paused", "draining", "drained", "offline"):
            if counts.get(name):
                fleet.append_text(state(name, suffix=f" {counts[name]}"))
                fleet.append("  ")
        if not overview.runners:
            fleet.append("no runner registered yet", style="dim")
        self.query_one("#fleet", Static).update(fleet)
        sync(
            self.query_one("#overview-runners", DataTable),
            [
                (
                    r.id,
                    [
                        plain(r.id, "bold"),
                        state("offline" if r.offline else r.state.value),
                        age(r.last_heartbeat_at, now),
                        str(r.live_jobs),
                        plain(
                            ", ".join(
                                f"{lane} {used}/{slots}"
                                for lane, (slots, used) in sorted(r.lanes.items())
                            )
                        ),
                    ],
                )
                for r in overview.runners
            ],
        )
        sync(
            self.query_one("#overview-events", DataTable),
            [
                (
                    str(e.id),
                    [
                        e.at.strftime("%H:%M:%S.%f")[:-3],
                        state(e.kind) if e.kind in STATE_STYLES else plain(e.kind),
                        str(e.job_id or ""),
                        str(e.lease_version or ""),
                        plain(e.runner_id or e.actor or ""),
                    ],
                )
                for e in recent
            ],
        )
