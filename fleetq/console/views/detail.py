"""View 4, job detail: requirements, eligibility (the claim's own rule), the lease
timeline with overlap windows, and the job's events."""

from __future__ import annotations

import json
from datetime import datetime
from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Input, Static

from fleetq.console import timeline
from fleetq.console.box import Box
from fleetq.console.text import age, duration, lines, one_line, plain, state
from fleetq.console.typeahead import focus_now
from fleetq.console.views.panel import Panel
from fleetq.console.views.table import Cell, Table, sync
from fleetq.core import provenance
from fleetq.core.models import Event, JobState
from fleetq.core.views import JobDetail


def event_row(event: Event, *, with_job: bool = True) -> tuple[str, list[Cell]]:
    """One event as table cells (its detail is untrusted text)."""
    cells: list[Cell] = [str(event.id), event.at.strftime("%H:%M:%S.%f")[:-3]]
    cells.append(
        state(event.kind)
        if event.kind in ("succeeded", "failed", "cancelled")
        else plain(event.kind, "bold")
    )
    if with_job:
        cells.append(str(event.job_id or ""))
    cells += [
        str(event.lease_version or ""),
        plain(event.runner_id or ""),
        plain(event.actor or ""),
        plain(one_line(json.dumps(event.detail, sort_keys=True) if event.detail else "", 80)),
    ]
    return str(event.id), cells


class DetailView(VerticalScroll):
    """The job picked in the jobs view (Enter), or given on the command line."""

    DEFAULT_CSS = """
    DetailView > Static { padding: 0 1; height: auto; }
    DetailView .title { text-style: bold; background: $boost; }
    DetailView DataTable { height: auto; max-height: 16; }
    DetailView #output-search { display: none; }
    DetailView.searching #output-search { display: block; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "search", "Search output", priority=True),
        Binding("escape", "escape", "Back", show=False),
        # priority: the events table's own End moved its cursor below the screen's edge
        Binding("G,end", "bottom", "Bottom", show=False, priority=True),
        Binding("g,home", "top", "Top", show=False, priority=True),
    ]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """`/` is a priority key (it acts before the keys typed after it); inside a box
        it is only a slash."""
        if action == "search":
            return not isinstance(self.app.focused, Input)
        return True

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.detail: JobDetail | None = None
        self.search = ""  # only output lines holding this (case-insensitive)

    def compose(self) -> ComposeResult:
        yield Panel(
            Text("no job selected: pick one in the jobs view (3) and press Enter"), id="detail-head"
        )
        yield Static("eligibility", classes="title")
        yield Static(id="detail-summary")
        yield Table(id="detail-eligibility", cursor_type="row", zebra_stripes=True)
        yield Static("lease timeline", classes="title")
        yield Static(id="detail-timeline")
        yield Static("output (live, from the database; newest lines; / searches)", classes="title")
        yield Box(placeholder="show only output lines holding… (empty: all)", id="output-search")
        yield Static(id="detail-output")
        yield Static("events", classes="title")
        yield Table(id="detail-events", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.query_one("#detail-eligibility", DataTable).add_columns("runner", "node", "verdict")
        self.query_one("#detail-events", DataTable).add_columns(
            "id", "at", "kind", "token", "runner", "actor", "detail"
        )

    def action_bottom(self) -> None:
        """G/End: the last event, and the view scrolled to show it."""
        table = self.query_one("#detail-events", DataTable)
        if table.row_count:
            table.move_cursor(row=table.row_count - 1)
        focus_now(table)
        self.scroll_end(animate=False)

    def action_top(self) -> None:
        """g/Home: the head of the detail (the first event selected)."""
        table = self.query_one("#detail-events", DataTable)
        if table.row_count:
            table.move_cursor(row=0)
        self.scroll_home(animate=False)

    def tick(self, now: datetime) -> None:
        """Once a second: the head's ages ("submitted 13s ago") move on, drawn again only
        when their text changed (a Static's update lays the screen out again)."""
        if self.detail is not None:
            self.query_one("#detail-head", Panel).show(head_text(self.detail, now))

    def show(self, detail: JobDetail, now: datetime) -> None:
        """Put a job's detail on screen."""
        self.detail = detail
        job = detail.job
        self.query_one("#detail-head", Panel).show(head_text(detail, now))
        explanation = detail.explanation
        summary = plain(explanation.summary(), "green" if explanation.eligible else "bold red")
        if job.state != JobState.QUEUED:
            summary = Text.assemble(("were it queued now: ", "dim"), summary)
        self.query_one("#detail-summary", Static).update(summary)
        sync(
            self.query_one("#detail-eligibility", DataTable),
            [
                (
                    v.runner_id,
                    [
                        plain(v.runner_id),
                        plain(v.node),
                        plain(v.describe(), "green" if v.eligible else ""),
                    ],
                )
                for v in explanation.runners
            ],
        )
        self.draw_timeline()
        self.query_one("#detail-output", Static).update(_output(detail, self.search))
        sync(
            self.query_one("#detail-events", DataTable),
            [event_row(e, with_job=False) for e in reversed(detail.events)],
        )

    def action_search(self) -> None:
        self.add_class("searching")
        box = self.query_one("#output-search", Input)
        box.value = self.search
        focus_now(box)

    @on(Input.Submitted, "#output-search")
    def _searched(self, event: Input.Submitted) -> None:
        self.search = event.value.strip()
        self.remove_class("searching")
        self.query_one("#detail-output", Static).scroll_visible()
        if self.detail is not None:
            self.query_one("#detail-output", Static).update(_output(self.detail, self.search))

    def action_escape(self) -> None:
        """Close the search box, else clear the search, else go back."""
        if self.has_class("searching"):
            self.remove_class("searching")
            focus_now(self.query_one("#detail-events", DataTable))
        elif self.search:
            self.search = ""
            if self.detail is not None:
                self.query_one("#detail-output", Static).update(_output(self.detail, ""))
        else:
            self.app.action_go_back()  # type: ignore[attr-defined]

    def expect(self, job_id: int | None) -> None:
        """The view opens on `job_id`: another job's detail must not stay on screen
        (under a loaded machine its read takes seconds) to be read as this one's."""
        if job_id is not None and (self.detail is None or self.detail.job.id != job_id):
            self.clear(f"job {job_id}: reading…", style="bold")

    def clear(self, why: str, *, style: str = "bold red") -> None:
        """Nothing to show (e.g. the job does not exist)."""
        self.detail = None
        self.query_one("#detail-head", Panel).show(Text(why, style=style))
        for name in ("#detail-summary", "#detail-timeline", "#detail-output"):
            self.query_one(name, Static).update("")
        for table in self.query(DataTable):
            table.clear()

    def draw_timeline(self) -> None:
        """(Re)draw the timeline at the view's width."""
        if self.detail is None:
            return
        width = max(60, self.size.width - 4)
        self.query_one("#detail-timeline", Static).update(
            Text("\n").join(timeline.render(self.detail, width))
        )

    def on_resize(self) -> None:
        self.draw_timeline()


def head_text(detail: JobDetail, now: datetime) -> Text:
    """The detail's head: what the job is, needs and has spent; ages from `now`."""
    job = detail.job
    head = Text()
    head.append(f"job {job.id}  ", style="bold")
    head.append(plain(f"{job.project}/{job.operation}", "bold"))
    head.append(f" @ {job.commit_sha[:12]}  lane ")
    head.append(plain(job.lane))
    head.append("  state ")
    head.append_text(state(job.state.value, suffix=" (stop pending)" if job.stop_pending else ""))
    if job.lease_owner:
        head.append(f"  token {job.lease_version} on ")
        head.append(plain(job.lease_owner))
    head.append("\nneeds: ")
    needs = [
        f"capabilities {', '.join(job.capabilities) or 'none'}",
        f"{job.memory_mb} MB",
        f"{job.cpu_millis / 1000:g} CPUs",
        f"timeout {duration(job.timeout_s)}",
    ]
    if job.requested_node:
        needs.append(f"node {job.requested_node}")
    head.append(plain("; ".join(needs)))
    head.append("\nsubmitted by ")
    head.append(plain(job.submitted_by))
    head.append(
        f" {age(job.created_at, now)} ago, priority class {job.priority_class}"
        + (f" (aged {job.promotions})" if job.promotions else "")
    )
    head.append("\nbudgets: ")
    head.append(budgets(detail))
    if job.retry_at is not None:
        head.append(f"; tried again at {job.retry_at:%H:%M:%S}", style="yellow")
    if job.idempotency_key:
        head.append("; key ")
        head.append(plain(job.idempotency_key))
    if job.payload:
        head.append("\npayload: ", style="bold")
        head.append(plain(one_line(json.dumps(job.payload, sort_keys=True), 200)))
    if job.failure_reason:
        head.append("\nreason: ", style="bold")
        head.append(plain(one_line(job.failure_reason, 200)))
    if job.cancel_reason:
        head.append("\ncancelled: ", style="bold")
        head.append(plain(one_line(job.cancel_reason, 200)))
    if job.traceparent:
        head.append("\ntrace: ", style="bold")
        head.append(plain(job.traceparent))
    if job.waiting_on:
        head.append("\nwaiting on: ", style="bold yellow")
        head.append(", ".join(map(str, job.waiting_on)) + " (queued when they have succeeded)")
    if detail.provenance is not None:
        head.append("\nverdict rests on: ", style="bold")
        head.append(plain("; ".join(provenance.lines(detail.provenance)[:PROVENANCE_LINES])))
    if detail.flaky:
        head.append("\nflaky at this commit: ", style="bold magenta")
        head.append(plain(", ".join(detail.flaky)) + " (failed, then passed)")
    return head


PROVENANCE_LINES = 12  # runner, machine, tools, staging, lockfiles, tests: `fleetq result -v`


OUTPUT_LINES = 40  # of the newest run; earlier runs get a few


def budgets(detail: JobDetail) -> Text:
    """What the job has spent of each budget that can end it, each counted apart: its
    application attempts (retries), a lost run's one requeue, and reassignments (lease
    expiries and self-fences). A budget with nothing left shows in yellow."""
    job = detail.job
    text = Text()
    last_try = detail.max_attempts > 1 and job.attempts >= detail.max_attempts
    text.append(f"attempt {job.attempts} of {detail.max_attempts}", "yellow" if last_try else "")
    text.append(" · ")
    rule = " (a lost run is requeued once, then the job fails)" if job.state.live else ""
    text.append(f"lost {job.lost_count}{rule}", "yellow" if job.lost_count >= 1 else "")
    if detail.reassignment_cap is not None:
        text.append(" · ")
        spent = job.reassign_count >= detail.reassignment_cap
        text.append(
            f"reassigned {job.reassign_count} of {detail.reassignment_cap}",
            "yellow" if spent else "",
        )
    return text


def _output(detail: JobDetail, search: str = "") -> Text:
    """The runs' newest shipped output (a cancelled or fenced run keeps its partial
    output), else the verdict's recorded tail; with `search`, only the lines holding it.
    Untrusted: shown as plain text, each line escaped (the search reads it as shown)."""
    runs = detail.runs_output
    needle = search.lower()

    def found(text: str | None) -> list[str]:
        shown = lines(text)
        return [line for line in shown if needle in line.lower()] if needle else shown

    if not runs:
        tail = found(detail.output)[-12:]
        if not tail:
            what = f"no output line holds {search!r}" if needle else "no output recorded"
            return Text(what, style="dim")
        return Text("\n").join(plain(line) for line in tail)
    text = Text()
    if needle:
        text.append(f"lines holding {search!r} (Esc shows all)\n", style="bold")
    for i, run in enumerate(runs):
        newest = i == len(runs) - 1
        shown = found(run.text)
        keep = OUTPUT_LINES if newest or needle else 5
        more = len(shown) > keep or run.cut
        text.append(f"── run t{run.token}", style="bold")
        text.append(" (earlier lines not shown)" if more else "", style="dim")
        text.append(" ──\n", style="bold")
        text.append_text(Text("\n").join(plain(line) for line in shown[-keep:]))
        if not newest:
            text.append("\n")
    return text
