"""View 1, the overview: lanes at a glance, queue wait, throughput, runners, alerts."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Static

from fleetq.console.messages import Heartbeats, OpenJob
from fleetq.console.text import STATE_STYLES, age, duration, escape, plain, sparkline, state
from fleetq.console.typeahead import focus_now
from fleetq.console.views.lanes import HISTORY, show_lanes
from fleetq.console.views.panel import Panel
from fleetq.console.views.runners import with_beats
from fleetq.console.views.table import Cell, Row, Table, sync
from fleetq.core.models import Event, JobId, Runner
from fleetq.core.views import THROUGHPUT_BUCKET_S, AlertJob, Heartbeat, Overview

SHORT = 32  # rows below which the figures give way to the runners and events
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
        text.append(" (even with all capacity free): `4` on one says why\n")
    if (
        alerts.stops_pending
        or alerts.stops_unconfirmed
        or alerts.open_overlaps
        or (alerts.unplaceable)
    ):
        text.append("  a: the jobs behind these alerts (Enter opens one)", style="italic")
    text.rstrip()
    return text


def stale_strip(since: datetime, why: str) -> Text:
    """While the console cannot read, the alerts are unknown: never 'all clear'."""
    text = Text(f"▲ not connected since {since:%H:%M:%S}", style="bold red")
    text.append(plain(f" ({why})" if why else ""))
    text.append(": alerts unknown; what is shown is the last read")
    return text


class OverviewView(Vertical):
    """The fleet at a glance; `a` goes to the jobs behind the alerts (Enter opens one)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "alert_jobs", "Alert jobs"),
    ]

    DEFAULT_CSS = """
    OverviewView #alerts { padding: 0 1; margin-bottom: 1; border: round $warning; height: auto; }
    OverviewView #overview-lanes { height: auto; max-height: 12; }
    OverviewView #figures { height: auto; }
    OverviewView #below { height: 1fr; }
    OverviewView #below DataTable { width: 1fr; height: 1fr; border: round $primary-darken-2; }
    OverviewView .panel { width: 1fr; padding: 0 1; border: round $primary-darken-2; height: auto; }
    OverviewView #alert-jobs { display: none; }
    OverviewView.alerting #alert-jobs { display: block; }
    OverviewView.short #figures { display: none; }
    OverviewView.short #alerts { margin-bottom: 0; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: tuple[Overview, list[Event]] | None = None

    def compose(self) -> ComposeResult:
        yield Panel(id="alerts")
        table: DataTable[Cell] = Table(id="overview-lanes", cursor_type="row", zebra_stripes=True)
        table.border_title = "lanes"
        yield table
        with Horizontal(id="figures"):
            yield Panel(id="waits", classes="panel")
            yield Panel(id="throughput", classes="panel")
            yield Panel(id="fleet", classes="panel")
        with Horizontal(id="below"):
            runners: DataTable[Cell] = Table(id="overview-runners", cursor_type="none")
            runners.border_title = "runners"
            yield runners
            recent: DataTable[Cell] = Table(id="overview-events", cursor_type="none")
            recent.border_title = "latest events"
            yield recent
            jobs: DataTable[Cell] = Table(id="alert-jobs", cursor_type="row")
            jobs.border_title = "alert jobs (a; Enter opens)"
            yield jobs

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
        for name in ("job", "kind", "at", "runner", "actor"):  # the job id first: never cut
            recent.add_column(name, key=name)
        jobs: DataTable[Cell] = self.query_one("#alert-jobs", DataTable)
        for name in ("job", "alert", "runner"):
            jobs.add_column(name, key=name)
        self.runners: list[Runner] = []

    def on_resize(self) -> None:
        self.set_class(self.size.height < SHORT, "short")  # 80x24: the runners first

    def action_alert_jobs(self) -> None:
        if self.has_class("alerting"):
            focus_now(self.query_one("#alert-jobs", DataTable))
        else:
            self.notify("no alert names a job now", timeout=2)

    @on(DataTable.RowSelected, "#alert-jobs")
    def _open(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.post_message(OpenJob(JobId(int(event.row_key.value))))

    @on(Heartbeats)
    def _beats(self, message: Heartbeats) -> None:
        self.beat(message.beats, message.now)

    def beat(self, beats: list[Heartbeat], now: datetime) -> None:
        """Fresh heartbeats (read once a second): the runners' ages, redrawn if changed."""
        self.runners = with_beats(self.runners, beats)
        self._show_runners(now)

    def stale(self, since: datetime, why: str) -> None:
        """The console lost the database: say so where 'all clear' would be."""
        self._shown = None
        self.query_one("#alerts", Panel).show(stale_strip(since, why))

    def show(
        self,
        overview: Overview,
        now: datetime,
        recent: list[Event],
        alert_jobs: list[AlertJob] | None = None,
    ) -> None:
        """Put a fresh overview (and the newest events, newest first) on screen; only
        what changed is redrawn."""
        if (overview, recent) == self._shown:
            return
        self._shown = (overview, recent)
        self.query_one("#alerts", Panel).show(alert_strip(overview, now))
        if alert_jobs is not None:
            self.set_class(bool(alert_jobs), "alerting")
            sync(self.query_one("#alert-jobs", DataTable), _alert_rows(alert_jobs))
        show_lanes(self.query_one("#overview-lanes", DataTable), overview, now, LANE_COLUMNS)
        waits = Text()
        for w in overview.waits:
            waits.append(f"class {w.priority_class}  ", style="bold")
            waits.append(f"p50 {duration(w.p50_s)}  p95 {duration(w.p95_s)}  ({w.jobs} jobs)\n")
        if not overview.waits:
            waits.append("no job claimed in the window", style="dim")
        self.query_one("#waits", Panel).show(waits)
        total = sum(overview.throughput)
        spark = Text(sparkline(overview.throughput), style="green")
        spark.append(
            f"\n{total} finished, {overview.throughput[-1] if overview.throughput else 0} "
            f"in the last {THROUGHPUT_BUCKET_S}s bucket"
        )
        self.query_one("#throughput", Panel).show(spark)
        counts = Counter("offline" if r.offline else r.state.value for r in overview.runners)
        fleet = Text()
        for name in ("active", "paused", "draining", "drained", "offline"):
            if counts.get(name):
                fleet.append_text(state(name, suffix=f" {counts[name]}"))
                fleet.append("  ")
        if not overview.runners:
            fleet.append("no runner registered yet", style="dim")
        self.query_one("#fleet", Panel).show(fleet)
        self.runners = overview.runners
        self._show_runners(now)
        sync(
            self.query_one("#overview-events", DataTable),
            [
                (
                    str(e.id),
                    [
                        str(e.job_id or ""),
                        state(e.kind) if e.kind in STATE_STYLES else plain(e.kind),
                        e.at.strftime("%H:%M:%S"),
                        plain(e.runner_id or ""),  # a runner only: submitters are actors
                        plain(e.actor or ""),
                    ],
                )
                for e in recent
            ],
        )

    def _show_runners(self, now: datetime) -> None:
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
                for r in self.runners
            ],
        )


def _alert_rows(jobs: list[AlertJob]) -> list[Row]:
    """One row per job (a row's key is its job), its alerts together: a cancelled job
    whose runner could not stop it is both a pending and an unconfirmed stop."""
    alerts: dict[JobId, list[AlertJob]] = {}
    for job in jobs:
        alerts.setdefault(job.job_id, []).append(job)
    return [
        (
            str(job),
            [
                str(job),
                ", ".join(a.alert for a in found),
                plain(next((a.runner_id for a in found if a.runner_id), "")),
            ],
        )
        for job, found in alerts.items()
    ]
