"""View 3, jobs: a page of jobs by key, filterable, with marks for bulk cancel."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Input, Static

from fleetq.console.messages import OpenJob
from fleetq.console.text import age, duration, escape, one_line, plain, state
from fleetq.console.views.table import Cell, Row, Table, selected_key, sync, visible_keys
from fleetq.core.eligibility import Explanation
from fleetq.core.models import Job, JobId, JobState
from fleetq.core.views import COUNT_CAP, JobFilter, JobPage

COLUMNS = (
    ("mark", " "),
    ("id", "id"),
    ("state", "state"),
    ("job", "project/operation"),
    ("commit", "commit"),
    ("age", "age"),
    ("lease", "lease"),
    ("owner", "owner"),
    ("token", "token"),
    ("lost", "lost/reassigned"),
    ("lane", "lane"),
    ("why", "reason"),
)
# what a narrow terminal shows (`w` toggles): nothing an operator acts on is cut off
NARROW = ("mark", "id", "state", "job", "commit", "age", "lease", "why")
WIDE_FROM = 150  # columns of terminal from which every column is shown
KEYS = ("lane", "state", "project", "runner")


FLAGS = ("reassigned>0", "lost>0")


def parse_filter(text: str) -> JobFilter:
    """`lane:checks state:queued project:webapp runner:node-a/r1 reassigned>0 lost>0`
    (any subset), and at most one bare word: a job id, commit prefix, operation, project
    or submitter."""
    fields: dict[str, object] = {}
    for word in text.split():
        if word in FLAGS:
            fields[word.removesuffix(">0")] = True
            continue
        key, sep, value = word.partition(":")
        if not sep:
            if "word" in fields:
                raise ValueError(f"{word!r}: one free word at most (an id, a commit, a name)")
            fields["word"] = word
            continue
        if key not in KEYS or not value:
            keys = ", ".join([*(k + ":VALUE" for k in KEYS), *FLAGS])
            raise ValueError(f"{word!r}: use {keys}, or one free word")
        fields[key] = value
    if "state" in fields and fields["state"] not in {s.value for s in JobState}:
        raise ValueError(f"state must be one of {', '.join(s.value for s in JobState)}")
    return JobFilter.model_validate(fields)


def describe_filter(where: JobFilter) -> str:
    """The filter as the operator would type it."""
    parts = [f"{k}:{getattr(where, k)}" for k in KEYS if getattr(where, k) is not None]
    parts += [flag for flag in FLAGS if getattr(where, flag.removesuffix(">0"))]
    if where.word:
        parts.append(where.word)
    return " ".join(p.replace("JobState.", "") for p in parts)


class JobsView(Vertical):
    """A page of jobs; `/` filters, `space` marks, `enter` opens the detail view."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter"),
        Binding("space", "mark", "Mark"),
        Binding("v", "mark_range", "Mark range", show=False),
        Binding("escape", "clear_marks", "Clear marks", show=False),
        Binding("w", "wide", "Wide", show=False),
        Binding("s", "sort", "Sort", show=False),
    ]
    DEFAULT_CSS = """
    JobsView #jobs-filter { display: none; }
    JobsView.filtering #jobs-filter { display: block; }
    JobsView #jobs-status { height: 1; padding: 0 1; color: $text-muted; }
    """

    class Filtered(Message):
        """The operator set a new filter."""

        def __init__(self, where: JobFilter) -> None:
            super().__init__()
            self.where = where

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.marked: set[JobId] = set()
        self._anchor: JobId | None = None  # the last row marked with space (for `v`)
        self.wide: bool | None = None  # None: by the terminal's width; `w` decides
        self.sort = 0  # index in SORTS; `s` cycles
        self.columns: tuple[str, ...] = ()
        self._now: datetime | None = None
        self.page: JobPage | None = None
        self.where = JobFilter()

    def compose(self) -> ComposeResult:
        yield Input(
            placeholder="lane:checks state:queued project:webapp runner:node-a/r1 reassigned>0 "
            "lost>0, and one free word: id, commit, operation, submitter  (empty: all)",
            id="jobs-filter",
        )
        yield Static(id="jobs-status")
        yield Table(id="jobs-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self._set_columns()

    def on_resize(self) -> None:
        if self._set_columns() and self.page is not None and self._now is not None:
            self.show(self.page, self._now)

    def action_wide(self) -> None:
        """Every column, or the narrow set, whatever the terminal's width."""
        self.wide = self.columns != tuple(k for k, _ in COLUMNS)
        if self._set_columns() and self.page is not None and self._now is not None:
            self.show(self.page, self._now)

    def _set_columns(self) -> bool:
        """(Re)build the columns for the width; True when they changed."""
        wide = self.wide if self.wide is not None else self.app.size.width >= WIDE_FROM
        keys = tuple(k for k, _ in COLUMNS if wide or k in NARROW)
        if keys == self.columns:
            return False
        self.columns = keys
        table = self.table
        table.clear(columns=True)
        for key, label in COLUMNS:
            if key in keys:
                table.add_column(label, key=key)
        return True

    @property
    def table(self) -> DataTable[Cell]:
        return self.query_one("#jobs-table", DataTable)

    def selected(self) -> JobId | None:
        """The job under the cursor."""
        key = selected_key(self.table)
        return JobId(int(key)) if key else None

    def targets(self) -> tuple[list[JobId], int]:
        """What an action applies to: the marked jobs on screen, else the one under the
        cursor; and how many marked jobs the filter hides (never acted on unseen)."""
        shown = {j.id for j in self.page.jobs} if self.page is not None else set()
        if self.marked:
            return sorted(self.marked & shown), len(self.marked - shown)
        job = self.selected()
        return ([job] if job is not None else []), 0

    def clear_marks(self) -> None:
        """Forget every mark (after an action, or on Esc)."""
        was, self.marked = self.marked, set()
        for job in was:
            if str(job) in self.table.rows:
                self.table.update_cell(str(job), "mark", " ")
        self._status()

    def show(self, page: JobPage, now: datetime) -> None:
        """Put a fresh page on screen, by key."""
        self.page = page
        self._now = now
        self._status()
        _, order = SORTS[self.sort]
        jobs = sorted(page.jobs, key=lambda j: order(j, now)) if order else page.jobs
        sync(self.table, [self._row(job, page, now) for job in jobs])

    def action_sort(self) -> None:
        """s: newest first, oldest first, by state, by lease left, by losses."""
        self.sort = (self.sort + 1) % len(SORTS)
        if self.page is not None and self._now is not None:
            self.show(self.page, self._now)
        self.notify(f"jobs sorted: {SORTS[self.sort][0]}", timeout=2)

    def _status(self) -> None:
        page = self.page
        if page is None:
            return
        shown = len(page.jobs)
        where = describe_filter(self.where) or "no filter"
        total = f"{page.total:,}+" if page.total >= COUNT_CAP else f"{page.total:,}"
        status = Text(f"{shown} of {total} jobs ({where}; {SORTS[self.sort][0]}, s sorts)")
        if page.total > shown:
            status.append(f" — newest {shown} shown; narrow with /")
        elif not shown:
            status.append(" — nothing matches" if self.where != JobFilter() else " — no job yet")
        if self.marked:
            _, hidden = self.targets()
            status.append(f" — {len(self.marked)} marked", style="bold magenta")
            if hidden:
                status.append(f" ({hidden} hidden by the filter: not acted on)")
            status.append("; Esc clears")
        self.query_one("#jobs-status", Static).update(status)

    def tick(self, now: datetime) -> None:
        """Redraw the clock-driven cells of the rows on screen."""
        if self.page is None:
            return
        by_id = {str(j.id): j for j in self.page.jobs}
        for key in visible_keys(self.table):
            job = by_id.get(key)
            if job is not None:
                self.table.update_cell(key, "lease", _lease(job, now))
                self.table.update_cell(key, "age", age(job.created_at, now))

    def _row(self, job: Job, page: JobPage, now: datetime) -> Row:
        why: Cell = ""
        if (explanation := page.waiting.get(job.id)) is not None:
            why = _waiting(explanation)
        elif job.retry_at is not None:
            why = Text(
                f"attempt {job.attempts} at {job.retry_at:%H:%M:%S}, after "
                f"{one_line(job.failure_reason or 'a failure', 70)}",
                style="yellow",
            )
        elif job.waiting_on:
            why = Text("waiting on " + ", ".join(map(str, job.waiting_on)), style="yellow")
        elif job.cancel_reason and job.state == JobState.CANCELLED:
            why = plain(one_line(job.cancel_reason, 70), "dim")
        elif job.failure_reason:
            why = plain(one_line(job.failure_reason, 70), "dim")
        label = job.state.value + (" (stop pending)" if job.stop_pending else "")
        cells: dict[str, Cell] = {
            "mark": Text("●", style="bold magenta") if job.id in self.marked else " ",
            "id": str(job.id),
            "state": state(job.state.value, suffix=label[len(job.state.value) :]),
            "job": plain(f"{job.project}/{job.operation}"),
            "commit": job.commit_sha[:10],
            "age": age(job.created_at, now),
            "lease": _lease(job, now),
            "owner": plain(job.lease_owner or job.reserved_on or ""),
            "token": str(job.lease_version),
            "lost": f"{job.lost_count}/{job.reassign_count}",
            "lane": plain(job.lane),
            "why": why,
        }
        return str(job.id), [cells[k] for k in self.columns]

    def action_mark(self) -> None:
        job = self.selected()
        if job is None:
            return
        self.marked.symmetric_difference_update({job})
        self._anchor = job if job in self.marked else None
        self._draw_mark(job)
        self.table.action_cursor_down()
        self._status()

    def action_mark_range(self) -> None:
        """Mark every row from the last row marked with space to the cursor."""
        job = self.selected()
        if job is None:
            return
        keys = [row.key.value for row in self.table.ordered_rows]
        if self._anchor is None or str(self._anchor) not in keys:
            self.action_mark()
            return
        a, b = sorted((keys.index(str(self._anchor)), keys.index(str(job))))
        for key in keys[a : b + 1]:
            if key is not None:
                self.marked.add(JobId(int(key)))
                self._draw_mark(JobId(int(key)))
        self._status()

    def action_clear_marks(self) -> None:
        if self.has_class("filtering"):
            self.remove_class("filtering")
            self.table.focus()
        elif self.marked:
            self.clear_marks()
            self.notify("marks cleared", timeout=2)
        else:
            self.app.action_go_back()  # type: ignore[attr-defined]

    def _draw_mark(self, job: JobId) -> None:
        if str(job) in self.table.rows:
            self.table.update_cell(
                str(job), "mark", Text("●", style="bold magenta") if job in self.marked else " "
            )

    def action_filter(self) -> None:
        self.add_class("filtering")
        box = self.query_one("#jobs-filter", Input)
        box.value = describe_filter(self.where)
        box.focus()

    @on(Input.Submitted, "#jobs-filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        try:
            where = parse_filter(event.value)
        except ValueError as exc:
            self.notify(escape(str(exc)), title="filter", severity="error", markup=False)
            return
        self.where = where
        self.remove_class("filtering")
        self.table.focus()
        self.post_message(self.Filtered(where))

    @on(DataTable.RowSelected, "#jobs-table")
    def _open(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.post_message(OpenJob(JobId(int(event.row_key.value))))


def _lease_left(job: Job, now: datetime) -> float:
    if not job.state.live or job.lease_expires_at is None:
        return float("inf")
    return (job.lease_expires_at - now).total_seconds()


Order = Callable[[Job, datetime], Any]
SORTS: tuple[tuple[str, Order | None], ...] = (
    ("newest first", None),  # the page's own order
    ("oldest first", lambda j, _now: (j.created_at, j.id)),
    ("by state", lambda j, _now: (j.state.value, -j.id)),
    ("least lease left first", lambda j, now: (_lease_left(j, now), -j.id)),
    ("most lost/reassigned first", lambda j, _now: (-(j.lost_count + j.reassign_count), -j.id)),
)


def _lease(job: Job, now: datetime) -> Cell:
    if not job.state.live or job.lease_expires_at is None:
        return ""
    left = (job.lease_expires_at - now).total_seconds()
    return Text(duration(left), style="red" if left < 0 else "")


def _waiting(explanation: Explanation) -> Text:
    """Why a queued job waits, short enough for a column: with an eligible runner it is
    only waiting its turn; with none, the reasons (the full table is in the detail)."""
    total = len(explanation.runners)
    if explanation.at_cap:
        return plain(one_line("; ".join(explanation.at_cap), 80), "yellow")
    if explanation.eligible:
        return Text(f"waiting its turn: {len(explanation.eligible)}/{total} runners eligible")
    parts = ", ".join(f"{n} {group}" for group, n in explanation.counts())
    return plain(one_line(f"no runner eligible now: {parts or 'none registered'}", 80), "red")
