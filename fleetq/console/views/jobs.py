"""View 3, jobs: a page of jobs by key, filterable, with marks for bulk cancel."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Input, Static

from fleetq.console.box import Box
from fleetq.console.messages import MarkedAll, OpenJob, Progress
from fleetq.console.text import escape, one_line, plain, state
from fleetq.console.typeahead import focus_now
from fleetq.console.views.filters import describe_filter, parse_filter
from fleetq.console.views.job_cells import SORTS, coarse_age, lease, same_page, waiting
from fleetq.console.views.table import (
    Cell,
    Change,
    Row,
    Table,
    literal,
    selected_key,
    sync,
    visible_keys,
)
from fleetq.core.jobpages import COUNT_CAP, JobFilter, JobOrder, JobPage
from fleetq.core.models import Job, JobId, JobState

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


class JobsView(Vertical):
    """A page of jobs; `/` filters, `space` marks, `enter` opens the detail view."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter", priority=True),  # acts before the next key
        Binding("space", "mark", "Mark"),
        Binding("v", "mark_range", "Mark range", show=False),
        # priority: the keys typed after it wait for the marks (`A C` cancels them all)
        Binding("A", "mark_all", "Mark all matching", show=False, priority=True),
        Binding("escape", "escape", "Clear filter / marks", show=False),
        Binding("w", "wide", "Wide", show=False),
        Binding("s", "sort", "Sort", show=False),
    ]
    DEFAULT_CSS = """
    JobsView #jobs-filter { display: none; }
    JobsView.filtering #jobs-filter { display: block; }
    JobsView #jobs-status { height: 1; padding: 0 1; color: $text-muted; }
    """

    class Filtered(Message):
        """The operator set a new filter or sort: the page must be read again."""

        def __init__(self, where: JobFilter) -> None:
            super().__init__()
            self.where = where

    class MarkAll(Message):
        """The operator asked to mark every job matching `where` (read on the server)."""

        def __init__(self, where: JobFilter) -> None:
            super().__init__()
            self.where = where

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.marked: set[JobId] = set()
        self.marked_where: JobFilter | None = None  # every match of it is marked (`A`)
        self.cancelling = ""  # a bulk cancel's progress, while it runs
        self._anchor: JobId | None = None  # the last row marked with space (for `v`)
        self.wide: bool | None = None  # None: by the terminal's width; `w` decides
        self.sort = 0  # index in SORTS; `s` cycles
        self.columns: tuple[str, ...] = ()
        self._now: datetime | None = None
        self.page: JobPage | None = None
        self.where = JobFilter()
        self.typed = False  # the filter was typed with `/` (Esc clears it), not a drill-down

    def compose(self) -> ComposeResult:
        yield Box(
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
            self.show(self.page, self._now, redraw=True)

    def action_wide(self) -> None:
        """Every column, or the narrow set, whatever the terminal's width."""
        self.wide = self.columns != tuple(k for k, _ in COLUMNS)
        if self._set_columns() and self.page is not None and self._now is not None:
            self.show(self.page, self._now, redraw=True)

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
    def table(self) -> Table:
        return self.query_one("#jobs-table", Table)

    def selected(self) -> JobId | None:
        """The job under the cursor."""
        key = selected_key(self.table)
        return JobId(int(key)) if key else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """`/` and `A` are priority keys (so they act before the keys typed after them);
        inside a box they are only a slash (`runner:node-a/r1`) and a letter."""
        if action in ("filter", "mark_all"):
            return not isinstance(self.app.focused, Input)
        return True

    def targets(self) -> tuple[list[JobId], int]:
        """What an action applies to: the marked jobs on screen (every match of the filter
        after `A`), else the one under the cursor; and how many marked jobs the filter
        hides (never acted on unseen)."""
        if self.marked_where is not None:
            return sorted(self.marked, reverse=True), 0
        shown = {j.id for j in self.page.jobs} if self.page is not None else set()
        if self.marked:
            return sorted(self.marked & shown), len(self.marked - shown)
        job = self.selected()
        return ([job] if job is not None else []), 0

    def clear_marks(self) -> None:
        """Forget every mark (after an action, or on Esc)."""
        was, self.marked = self.marked, set()
        self.marked_where = None
        for job in was:
            if str(job) in self.table.rows:
                self.table.update_cell(str(job), "mark", " ")
        self._status()

    def show(self, page: JobPage, now: datetime, *, redraw: bool = False) -> None:
        """Put a fresh page on screen, by key; an unchanged page redraws nothing (the
        1 s tick moves its clocks)."""
        shown = self.page
        same = not redraw and shown is not None and same_page(shown, page)
        self.page = page
        self._now = now
        if same:
            return
        self._status()
        if self.marked_where is not None and self.marked_where != page.where:
            self.clear_marks()  # marked as "every match" of a filter no longer shown
        _, _, key = SORTS[self.sort]
        jobs = sorted(page.jobs, key=lambda j: key(j, now)) if key else page.jobs
        sync(self.table, [self._row(job, page, now) for job in jobs])
        if shown is not None and (shown.where, shown.order) != (page.where, page.order):
            self.table.action_first_row()  # another filter or order: a new listing, from its top

    @property
    def order(self) -> JobOrder:
        """The order the page is cut in on the server."""
        return SORTS[self.sort][0]

    def action_sort(self) -> None:
        """s: newest first, oldest first, by state, by lease left, by losses. The rows on
        screen are sorted at once; the page cut in the new order follows (a read)."""
        self.sort = (self.sort + 1) % len(SORTS)
        if self.page is not None and self._now is not None:
            self.show(self.page, self._now, redraw=True)
        self.table.action_first_row()
        self.post_message(self.Filtered(self.where))
        self.notify(f"jobs sorted: {SORTS[self.sort][1]}", timeout=2)

    def _status(self) -> None:
        page = self.page
        if page is None:
            return
        shown = len(page.jobs)
        where = describe_filter(page.where) or "no filter"
        total = f"{page.total:,}+" if page.total >= COUNT_CAP else f"{page.total:,}"
        order, label, _ = SORTS[self.sort]
        status = Text(f"{shown:,} of {total} jobs ({where}; {label}, s sorts)")
        if page.total > shown:
            # the first of the whole match in this order, or (until the page cut in it is
            # read) the rows of the last page sorted: say which
            first = f"first {shown:,} {label}" if page.order == order else f"{shown:,} read"
            status.append(f" — {first} shown; narrow with /, A marks all {total}")
        elif not shown:
            status.append(" — nothing matches" if page.where != JobFilter() else " — no job yet")
        if self.marked:
            _, hidden = self.targets()
            every = " (every match)" if self.marked_where is not None else ""
            status.append(f" — {len(self.marked):,} marked{every}", style="bold reverse")
            if hidden:
                status.append(f" ({hidden} hidden by the filter: not acted on)")
            status.append("; Esc clears")
        if self.cancelling:
            status.append(f" — {self.cancelling}", style="bold")
        self.query_one("#jobs-status", Static).update(status)

    def tick(self, now: datetime) -> None:
        """Redraw the clock-driven cells of the rows on screen, those that changed."""
        if self.page is None:
            return
        by_id = {str(j.id): j for j in self.page.jobs}
        table = self.table
        changes: list[Change] = []
        for key in visible_keys(table):
            job = by_id.get(key)
            if job is None:
                continue
            for column, value in (
                ("lease", lease(job, now)),
                ("age", coarse_age(job.created_at, now)),
            ):
                if column in self.columns and table.get_cell(key, column) != literal(value):
                    changes.append((key, column, value))
        table.update_cells(changes)

    def _row(self, job: Job, page: JobPage, now: datetime) -> Row:
        why: Cell = ""
        if (explanation := page.waiting.get(job.id)) is not None:
            why = waiting(explanation)
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
            "age": coarse_age(job.created_at, now),
            "lease": lease(job, now),
            "owner": plain(job.lease_owner or job.reserved_on or ""),
            "token": str(job.lease_version),
            "lost": f"{job.lost_count}/{job.reassign_count}",
            "lane": plain(job.lane),
            "why": why,
        }
        return str(job.id), [cells[k] for k in self.columns]

    def _may_mark(self) -> bool:
        """Marks are for cancel: a login that may not cancel is told so, not marked."""
        operator = self.app.operator  # type: ignore[attr-defined]
        return bool(operator.may("cancel_jobs") or operator.allowed("cancel_jobs"))

    def action_mark(self) -> None:
        job = self.selected()
        if job is None or not self._may_mark():
            return
        self.marked.symmetric_difference_update({job})
        self._anchor = job if job in self.marked else None
        self._draw_mark(job)
        self.table.action_cursor_down()
        self._status()

    def action_mark_range(self) -> None:
        """Mark every row from the last row marked with space to the cursor."""
        job = self.selected()
        if job is None or not self._may_mark():
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

    def action_escape(self) -> None:
        """Esc: close the filter box, else clear the marks, else clear the filter, else
        go back."""
        if self.has_class("filtering"):
            self.remove_class("filtering")
            focus_now(self.table)
        elif self.marked:
            self.clear_marks()
            self.notify("marks cleared", timeout=2)
        elif self.typed and self.where != JobFilter():
            self.set_filter(JobFilter())
            self.post_message(self.Filtered(self.where))
        else:
            self.app.action_go_back()  # type: ignore[attr-defined]

    def set_filter(self, where: JobFilter, *, typed: bool = False) -> None:
        """Show `where` from the next page on: a drill-down's (Esc then goes back to where
        it came from) or a typed one (`:jobs FILTER`: Esc clears it first)."""
        self.where = where
        self.typed = typed

    def action_mark_all(self) -> None:
        """A: mark every job matching the filter, however many (read on the server)."""
        if not self._may_mark():
            return
        self.app.hold_keys("the marks")  # type: ignore[attr-defined]  # `A C`: what A marks
        self.post_message(self.MarkAll(self.where))

    def mark_all(self, where: JobFilter, ids: list[JobId]) -> None:
        """Every match of `where` is marked; a cancel then names the count and filter."""
        self.marked = set(ids)
        self.marked_where = where
        for key in visible_keys(self.table):
            self._draw_mark(JobId(int(key)))
        self._status()
        self.notify(f"{len(ids):,} job(s) marked: every match of the filter", timeout=3)

    @on(MarkedAll)
    def _marked_all(self, message: MarkedAll) -> None:
        if message.where == self.where:
            self.mark_all(message.where, message.ids)
        self.app.release_keys()  # type: ignore[attr-defined]  # held by `A`

    @on(Progress)
    def _progress(self, message: Progress) -> None:
        self.progress(message.done, message.total)

    def progress(self, done: int, total: int) -> None:
        """A bulk cancel's progress, in the status line until it ends."""
        self.cancelling = "" if done >= total else f"cancelling: {done:,} of {total:,} done"
        self._status()

    def _draw_mark(self, job: JobId) -> None:
        if str(job) in self.table.rows:
            self.table.update_cell(
                str(job), "mark", Text("●", style="bold magenta") if job in self.marked else " "
            )

    def action_filter(self) -> None:
        self.add_class("filtering")
        box = self.query_one("#jobs-filter", Input)
        box.value = describe_filter(self.where)
        box.cursor_position = len(box.value)
        focus_now(box)

    @on(Input.Submitted, "#jobs-filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        try:
            where = parse_filter(event.value)
        except ValueError as exc:
            self.notify(escape(str(exc)), title="filter", severity="error", markup=False)
            return
        self.where = where
        self.typed = True
        self.remove_class("filtering")
        focus_now(self.table)
        self.post_message(self.Filtered(where))

    @on(DataTable.RowSelected, "#jobs-table")
    def _open(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.post_message(OpenJob(JobId(int(event.row_key.value))))
