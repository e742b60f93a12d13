"""The console application: global keys, the six views, and the data flow between them.

Data flow (STYLE example 10): the `Follower` worker turns NOTIFY into coalesced `Hint`
messages; a hint starts one load worker, which reads the visible views through `Source`
and posts `Loaded`; only `@on` handlers here put data into widgets. Loads never overlap:
a hint that arrives mid-load schedules one more load after it, so a busy fleet costs at
most one read in flight. Actions go through `fleetq.core`, then ask for a reload.
"""

from __future__ import annotations

import asyncio
import functools
import getpass
import logging
import os
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import ClassVar, TypeVar

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer, Header

from fleetq.console import screen
from fleetq.console.dialogs import CommandLine, Confirm, DrainForm, Help, ReasonForm
from fleetq.console.live import Follower
from fleetq.console.messages import (
    Acted,
    DrainPreview,
    DrillDown,
    Health,
    Hint,
    Loaded,
    Missing,
    OpenJob,
)
from fleetq.console.source import Source
from fleetq.console.text import escape
from fleetq.console.views.detail import DetailView
from fleetq.console.views.events import EventsView
from fleetq.console.views.jobs import JobsView, parse_filter
from fleetq.console.views.lanes import LanesView
from fleetq.console.views.overlaps import OverlapsView
from fleetq.console.views.overview import OverviewView
from fleetq.console.views.runners import RunnersView
from fleetq.console.views.schedules import SchedulesView
from fleetq.core.errors import FleetqError, NotFound
from fleetq.core.models import JobId, RunnerState
from fleetq.core.views import JobFilter, Overview

VIEWS = ("overview", "lanes", "jobs", "detail", "runners", "events", "overlaps", "schedules")
ACTIONS = frozenset({"cancel_jobs", "runner_state"})
EVENT_BATCH = 1000
EVENT_LOOKBACK = 200  # ids re-read behind the newest seen (late commits)
log = logging.getLogger(__name__)
RUNNER_EFFECTS = {
    RunnerState.PAUSED: "it claims nothing new until resumed; what it runs now continues",
    RunnerState.ACTIVE: "it claims work again",
}


M = TypeVar("M")


def while_open(handler: Callable[[ConsoleApp, M], None]) -> Callable[[ConsoleApp, M], None]:
    """Drop a message that arrives once the app has begun to close. Closing removes the
    widgets, each view's children before the view, while the app still reads its
    messages (Textual's test harness closes it so): a read that landed then found a jobs
    view without its status line, and the console ended with NoMatches."""

    @functools.wraps(handler)
    def handle(app: ConsoleApp, message: M) -> None:
        if app.is_running:
            handler(app, message)

    return handle


class ConsoleApp(App[None]):
    """`fleetq-console`."""

    TITLE = "fleetq"
    CSS = """
    Screen.stale Header { background: $error; }
    ContentSwitcher { height: 1fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        *(
            Binding(str(n), f"view('{name}')", name.capitalize())
            for n, name in enumerate(VIEWS, start=1)
        ),
        Binding("escape,backspace", "go_back", "Back", show=False),
        Binding("C", "cancel_jobs", "Cancel"),
        Binding("d", "runner_state('draining')", "Drain"),
        Binding("p", "runner_state('paused')", "Pause"),
        Binding("u", "runner_state('active')", "Resume"),
        Binding("question_mark,f1", "help", "Help"),
        Binding("colon", "command_line", ":view", show=False),
        Binding("r", "reload", "Reload", show=False),
        Binding("Z", "freeze", "Freeze", show=False),
        Binding("c", "copy", "Copy id", show=False),
        Binding("ctrl+s", "save_svg", "Screenshot", show=False),
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    def __init__(
        self,
        dsn: str,
        *,
        readonly: bool = False,
        actor: str | None = None,
        clock: datetime | None = None,
        live: bool = True,
        job: JobId | None = None,
        view: str = "overview",
        title: str | None = None,
        resync_s: float = 5.0,
    ) -> None:
        super().__init__()
        self.source = Source(dsn, clock=clock)
        self.readonly = readonly
        self.actor = actor or getpass.getuser()
        self.live = live
        self.current = view
        self.history: list[str] = []  # views left, for Esc / Backspace
        self.frozen = False  # Z: the screen holds still to be read; `r` still reloads
        self._missed = False
        self.detail_job = job
        self.where = JobFilter()
        self.stale_since: datetime | None = None
        self.stale_why = ""  # what the last failed read or connect said
        self.ready = False
        self.last_event: int | None = None
        self._loading = False
        self._again: Hint | None = None
        self.loads = 0  # reads put on screen, not failed ones (tests wait on it)
        self._db_now: tuple[datetime, float] | None = None
        self.overview: Overview | None = None
        self.outages = 0  # times the console went stale
        self._epoch = 0  # bumped by each reported outage
        self.follower = Follower(
            dsn,
            self.post_message,
            resync_s=resync_s,
            watching=lambda: self.detail_job if self.current == "detail" else None,
        )
        if title:
            self.title = title

    # ---- layout ------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="◆")
        with ContentSwitcher(initial=self.current):
            yield OverviewView(id="overview")
            yield LanesView(id="lanes")
            yield JobsView(id="jobs")
            yield DetailView(id="detail")
            yield RunnersView(id="runners")
            yield EventsView(id="events")
            yield OverlapsView(id="overlaps")
            yield SchedulesView(id="schedules")
        yield Footer()

    def on_mount(self) -> None:
        self._status()
        self._boot()
        # the view opened on (--view) gets the keyboard at once, as one switched to does
        self.call_after_refresh(self._focus_view, self.current)
        if self.source.clock is None:
            self.set_interval(1.0, self._tick)

    async def on_unmount(self) -> None:
        await self.source.close()

    @work(group="boot", exit_on_error=False)
    async def _boot(self) -> None:
        """Connect (retrying with backoff while the database is away), then follow."""
        delay = 0.25
        while True:
            try:
                await self.source.open()
                break
            except FleetqError as exc:
                self.post_message(Health(datetime.now().astimezone(), why=str(exc)))
                await self.source.close()
                await _pause(delay)
                delay = min(delay * 2, 5.0)
        if self.live:
            self.run_worker(self.follower.follow(), group="listen", exit_on_error=False)
        else:
            self.post_message(Hint(resync=True))

    # ---- loading -----------------------------------------------------------------

    @on(Hint)
    @while_open
    def _hint(self, hint: Hint) -> None:
        if self.frozen and not hint.resync:
            self._missed = True  # shown when the operator thaws the screen
            return
        if self._loading:
            resync = hint.resync or (self._again.resync if self._again else False)
            self._again = Hint(resync=resync)
            return
        self._loading = True
        self._load(hint.resync)

    @work(group="load", exit_on_error=False)
    async def _load(self, resync: bool) -> None:
        """Read what the visible views show; post it (never touch widgets here).

        Every path ends in exactly one `Loaded` (a failed one on any error), so a load can
        never stay "in flight" and block the ones after it."""
        epoch = self._epoch
        try:
            at = await self.source.now()
            overview = await self.source.overview(at)
            page = await self.source.page(self.where, at) if self.current == "jobs" else None
            overlaps = await self.source.overlaps() if self.current == "overlaps" else None
            listed = await self.source.schedules(at) if self.current == "schedules" else None
            detail = None
            if self.current == "detail" and self.detail_job is not None:
                try:
                    detail = await self.source.detail(self.detail_job, at)
                except NotFound:
                    self.post_message(Missing(self.detail_job))
            # Event ids are taken at insert, not at commit: re-read a window behind the
            # newest id seen, so an event whose transaction committed late still shows.
            after = None if resync or self.last_event is None else self.last_event
            events = await self.source.events(
                None if after is None else max(0, after - EVENT_LOOKBACK),
                EVENT_BATCH + EVENT_LOOKBACK,
            )
            full = after is None or len(events) >= EVENT_BATCH + EVENT_LOOKBACK
            if full and after is not None:
                events = await self.source.events(None, EVENT_BATCH)
        except Exception as exc:  # any failure must end the load
            why = str(exc) if isinstance(exc, FleetqError) else f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, FleetqError):
                log.exception("console load failed")
            self.post_message(Health(datetime.now().astimezone(), why=why))
            self.post_message(Loaded.failed(epoch))
            return
        self.post_message(
            Loaded(
                overview,
                page,
                detail,
                events,
                resync=full,
                epoch=epoch,
                overlaps=overlaps,
                schedules=listed,
            )
        )

    @property
    def busy(self) -> bool:
        """A read is in flight or due."""
        return self._loading or self._again is not None

    @on(Loaded)
    @while_open
    def _loaded(self, loaded: Loaded) -> None:
        self._loading = False
        if not loaded.ok:
            self._retry()
            return
        self.loads += 1
        overview = loaded.overview
        assert overview is not None
        self._db_now = (overview.now, time.monotonic())
        events = self.query_one(EventsView)
        if loaded.resync:
            events.reset(loaded.events, draw=self.current == "events")
        else:
            events.extend(loaded.events, draw=self.current == "events")
        self.overview = overview
        self._show_overview()
        if loaded.page is not None and self.current == "jobs" and loaded.page.where == self.where:
            self.query_one(JobsView).show(loaded.page, overview.now)
        if loaded.overlaps is not None and self.current == "overlaps":
            self.query_one(OverlapsView).show(loaded.overlaps, overview.now)
        if loaded.schedules is not None and self.current == "schedules":
            self.query_one(SchedulesView).show(loaded.schedules, overview.now)
        detail = loaded.detail
        if detail is not None and self.current == "detail" and detail.job.id == self.detail_job:
            self.query_one(DetailView).show(detail, overview.now)
        if loaded.events:
            self.last_event = max(self.last_event or 0, loaded.events[-1].id)
        # Live again only on a read that began after the last outage was reported, and
        # while the database is being followed (else a read already in flight when the
        # LISTEN link dropped would switch actions back on).
        following = not self.live or self.follower.connected.is_set()
        if loaded.epoch == self._epoch and following and (self.stale_since or not self.ready):
            self.stale_since = None
            self.ready = True
            self._status()
        if self._again is not None:
            again, self._again = self._again, None
            self._hint(again)

    def _show_overview(self) -> None:
        """Put the latest overview into the visible view that shows it (hidden views are
        drawn when they are switched to: a big fleet costs one table, not four)."""
        if self.overview is None:
            return
        now = self.overview.now
        if self.current == "overview":
            recent = list(self.query_one(EventsView).tail)[-40:][::-1]
            self.query_one(OverviewView).show(self.overview, now, recent)
        elif self.current == "lanes":
            self.query_one(LanesView).show(self.overview, now)
        elif self.current == "runners":
            self.query_one(RunnersView).show(self.overview.runners, now)

    def _retry(self) -> None:
        """After a failed load: run what was due, else try again in a second (a load can
        fail while the LISTEN link is fine, e.g. a query timeout)."""
        if self._again is not None:
            again, self._again = self._again, None
            self._hint(again)
        else:
            self.set_timer(1.0, lambda: self.post_message(Hint(resync=True)))

    @on(Health)
    @while_open
    def _health(self, health: Health) -> None:
        if health.stale_since is None:
            return
        self._epoch += 1  # reads begun before this cannot clear it
        self.stale_why = _why(health.why)
        if self.stale_since is None:
            self.stale_since = health.stale_since
            self.outages += 1
            self.notify(
                escape(health.why) or "connection lost",
                title="stale",
                severity="warning",
                markup=False,
            )
        self._status()

    @on(Missing)
    @while_open
    def _missing(self, missing: Missing) -> None:
        if self.detail_job == missing.job_id:
            self.detail_job = None
            self.query_one(DetailView).clear(f"no job {missing.job_id}")
            self.notify(f"no job {missing.job_id}", severity="error", markup=False)

    def _status(self) -> None:
        self.screen_stack[0].set_class(self.stale_since is not None, "stale")
        if self.stale_since is not None:
            self.sub_title = (
                f"STALE since {self.stale_since:%H:%M:%S}: {self.stale_why or 'connection lost'}"
                " · reconnecting, actions off"
            )
            self.query_one(OverviewView).stale(self.stale_since, self.stale_why)
        else:
            mode = "read-only" if self.readonly else f"acting as {self.actor}"
            live = "FROZEN (Z thaws, r reloads)" if self.frozen else "live"
            self.sub_title = (
                f"{live if self.ready else 'connecting'} · {VIEWS_TITLE[self.current]} · {mode}"
            )
        self.refresh_bindings()

    def _tick(self) -> None:
        """Once a second: ages and lease countdowns from database time."""
        if self._db_now is None:
            return
        then, mono = self._db_now
        now = then + timedelta(seconds=time.monotonic() - mono)
        try:
            if self.current == "jobs":
                self.query_one(JobsView).tick(now)
            elif self.current == "runners":
                self.query_one(RunnersView).tick(now)
        except NoMatches:
            pass  # a tick while the view's widgets are still mounting, or already gone

    # ---- navigation --------------------------------------------------------------

    def action_go_back(self) -> None:
        """Esc / Backspace: back to the view this one was opened from."""
        if self.history:
            self.action_view(self.history.pop(), remember=False)

    def action_view(self, name: str, remember: bool = True) -> None:
        """Switch to a view (and read it now)."""
        if name not in VIEWS:
            self.notify(
                f"no view named '{escape(name)}': {', '.join(VIEWS)}",
                severity="error",
                markup=False,
            )
            return
        if remember and name != self.current:
            self.history = [*self.history, self.current][-20:]
        self.current = name
        self.query_one(ContentSwitcher).current = name
        self._show_overview()
        if name == "events":
            self.query_one(EventsView).draw()
        self._focus_view(name)
        self._status()
        self.post_message(Hint())

    def _focus_view(self, name: str) -> None:
        view = self.query_one(f"#{name}")
        tables = list(view.query("DataTable"))
        if tables:
            tables[-1 if name == "detail" else 0].focus()

    @on(OpenJob)
    @while_open
    def _open_job(self, message: OpenJob) -> None:
        self.detail_job = message.job_id
        self.action_view("detail")

    @on(DrillDown)
    @while_open
    def _drill_down(self, message: DrillDown) -> None:
        """A runner's or a lane's jobs (or a runner's events); Esc comes back."""
        if message.events and message.runner is not None:
            self.query_one(EventsView).filter_words([message.runner])
            self.action_view("events")
            return
        self._show_jobs(JobFilter(runner=message.runner, lane=message.lane))

    def _show_jobs(self, where: JobFilter) -> None:
        """The jobs view under `where` (a drill-down, or `:jobs FILTER`)."""
        self.query_one(JobsView).where = where
        self.where = where
        self.action_view("jobs")

    @on(JobsView.Filtered)
    @while_open
    def _filtered(self, message: JobsView.Filtered) -> None:
        self.where = message.where
        self.post_message(Hint())

    def action_help(self) -> None:
        self.push_screen(Help())

    def action_command_line(self) -> None:
        def chosen(name: str | None) -> None:
            words = (name or "").split()
            if name in ("q", "quit"):
                self.exit()
            elif len(words) > 1 and words[0] == "jobs":  # :jobs state:running lost>0
                try:
                    where = parse_filter(" ".join(words[1:]))
                except ValueError as exc:
                    self.notify(escape(str(exc)), title=":jobs", severity="error", markup=False)
                    return
                self._show_jobs(where)
            elif words and words[-1].isdigit() and words[0] in ("job", "detail", words[-1]):
                self.detail_job = JobId(int(words[-1]))
                self.action_view("detail")
            elif name:
                self.action_view(name)

        self.push_screen(CommandLine(), chosen)

    def action_reload(self) -> None:
        self.post_message(Hint(resync=True))

    def action_freeze(self) -> None:
        """Z: hold the screen still (changes are not drawn) until Z again."""
        self.frozen = not self.frozen
        if not self.frozen and self._missed:
            self._missed = False
            self.post_message(Hint())
        self._status()

    def action_copy(self) -> None:
        """c: copy the selected job's id and commit (OSC 52: the terminal must allow it)."""
        job = None
        if self.current == "jobs" and (selected := self.query_one(JobsView).selected()):
            page = self.query_one(JobsView).page
            job = next((j for j in page.jobs if j.id == selected), None) if page else None
        elif self.current == "detail" and (shown := self.query_one(DetailView).detail):
            job = shown.job
        if job is None:
            self.notify("no job selected to copy", severity="warning")
            return
        self.copy_to_clipboard(f"{job.id} {job.commit_sha}")
        self.notify(
            f'copied "{job.id} {job.commit_sha}" (through the terminal: if nothing was '
            "copied, it does not allow OSC 52; the id and commit are in this message)",
            markup=False,
        )

    def action_save_svg(self) -> None:
        """Save the screen as SVG in $FLEETQ_SCREENSHOTS (default: the current directory)."""
        folder = os.environ.get("FLEETQ_SCREENSHOTS", ".")
        name = f"fleetq-console-{self.current}-{datetime.now():%Y%m%d-%H%M%S}.svg"
        path = self.save_screenshot(filename=name, path=folder)
        self.notify(f"saved {path}", title="screenshot", markup=False)

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for name in VIEWS:
            yield SystemCommand(
                f"View: {name}",
                f"Switch to the {VIEWS_TITLE[name]} view",
                lambda n=name: self.action_view(n),
            )
        if not self.readonly:
            yield SystemCommand(
                "Cancel jobs", "Cancel the marked or selected jobs", self.action_cancel_jobs
            )
            for state, label in (
                (RunnerState.DRAINING, "Drain"),
                (RunnerState.PAUSED, "Pause"),
                (RunnerState.ACTIVE, "Resume"),
            ):
                yield SystemCommand(
                    f"{label} runner",
                    f"{label} the runner under the cursor (view 5)",
                    lambda s=state.value: self.action_runner_state(s),
                )

    # ---- actions -----------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Actions are hidden read-only and outside their view. While stale they stay
        shown and say why they do nothing (a dimmed key gave no feedback at all)."""
        if action not in ACTIONS:
            return True
        if self.readonly:
            return False
        return self.current in _ACTION_VIEWS[action]

    def _acting_allowed(self, action: str) -> bool:
        """Whether `action` may run now; if not, say why (keys and the palette alike)."""
        views = _ACTION_VIEWS[action]
        if self.readonly:
            why = "read-only console (--readonly): actions are off"
        elif self.current not in views:
            where = " and ".join(f"the {VIEWS_TITLE[v]} view ({VIEWS.index(v) + 1})" for v in views)
            why = f"{_ACTION_NAMES[action]} works in {where}"
        elif self.stale_since is not None or not self.ready:
            why = "not connected: actions wait until the console has resynced"
        else:
            return True
        self.notify(why, severity="warning", markup=False)
        return False

    def action_cancel_jobs(self) -> None:
        """Cancel the marked jobs (or the selected one), after a confirmation."""
        if not self._acting_allowed("cancel_jobs"):
            return
        hidden = 0
        if self.current == "detail":
            targets = [self.detail_job] if self.detail_job is not None else []
            shown = self.query_one(DetailView).detail
            known = {shown.job.id: shown.job.state} if shown is not None else {}
        else:
            view = self.query_one(JobsView)
            targets, hidden = view.targets()
            known = {j.id: j.state for j in view.page.jobs} if view.page is not None else {}
        left_alone = f" {hidden} marked job(s) the filter hides are left alone." if hidden else ""
        if not targets:
            self.notify(
                "no job selected" + (f":{left_alone}" if hidden else ""), severity="warning"
            )
            return
        finished = [j for j in targets if j in known and known[j].terminal]
        targets = [j for j in targets if j not in finished]
        if not targets:
            states = ", ".join(f"job {j} is {known[j].value}" for j in finished[:5])
            self.notify(f"nothing to cancel: {states}", severity="warning", markup=False)
            return
        ids = ", ".join(str(j) for j in targets[:12]) + (" …" if len(targets) > 12 else "")
        noun = "job" if len(targets) == 1 else "jobs"
        body = Text(
            f"Cancel {len(targets)} {noun}: {ids} — runners will be asked to stop them; "
            "they show stop pending until the stop is confirmed. Queued jobs are cancelled "
            "at once." + (f" Skipping {len(finished)} finished." if finished else "") + left_alone
        )

        def answered(yes: bool | None) -> None:
            if yes and self._acting_allowed("cancel_jobs"):  # it may have gone stale since
                self._cancel(targets)
                if self.current == "jobs":
                    self.query_one(JobsView).clear_marks()  # done with: they do not linger

        self.push_screen(Confirm(f"Cancel {len(targets)} {noun}?", body), answered)

    @work(group="act", exit_on_error=False)
    async def _cancel(self, targets: list[JobId]) -> None:
        try:
            results = await self.source.cancel(targets, self.actor)
        except FleetqError as exc:
            self.post_message(Acted(f"cancel failed: {exc}", error=True))
            return
        pending = sum(r.stop_pending for r in results)
        changed = sum(r.previous_state != r.state for r in results)
        self.post_message(
            Acted(f"cancelled {changed} of {len(targets)} job(s); {pending} stop(s) pending")
        )

    def action_runner_state(self, state: str) -> None:
        """Drain (with a reason and a preview), pause or resume the selected runner; in
        the schedules view, pause (with a reason) or resume the selected schedule."""
        if not self._acting_allowed("runner_state"):
            return
        if self.current == "schedules":
            if state != RunnerState.DRAINING:
                self._schedule_state(paused=state == RunnerState.PAUSED)
            else:
                self.notify("a schedule is paused (p) or resumed (u)", severity="warning")
            return
        runner = self.query_one(RunnersView).selected()
        if runner is None:
            self.notify("no runner selected", severity="warning")
            return
        target = RunnerState(state)
        current = self.query_one(RunnersView).state_of(runner)
        if current == target or (target == RunnerState.DRAINING and current == RunnerState.DRAINED):
            # nothing to change, and an operator's recorded reason must not be overwritten
            self.notify(
                f"{escape(runner)} is already {current.value}", severity="warning", markup=False
            )
            return
        if target == RunnerState.ACTIVE and current is None:
            self.notify(f"{escape(runner)} is offline", severity="warning", markup=False)
            return
        if target == RunnerState.DRAINING:
            self._preview_drain(runner)
            return
        verb = "Resume" if target == RunnerState.ACTIVE else "Pause"
        body = Text(f"{verb} runner ")
        body.append(escape(runner), style="bold")
        body.append(f": {RUNNER_EFFECTS[target]}.")

        def answered(yes: bool | None) -> None:
            if yes and self._acting_allowed("runner_state"):
                self._set_runner_state(runner, target, f"{verb.lower()}d in console")

        self.push_screen(Confirm(f"{verb} {escape(runner)}?", body), answered)

    @work(group="act", exit_on_error=False)
    async def _preview_drain(self, runner: str) -> None:
        try:
            preview = await self.source.drain_preview(runner)
        except FleetqError as exc:
            self.post_message(Acted(f"drain preview failed: {exc}", error=True))
            return
        self.post_message(DrainPreview(runner, preview))

    @on(DrainPreview)
    @while_open
    def _drain_form(self, message: DrainPreview) -> None:
        def answered(reason: str | None) -> None:
            if reason is not None and self._acting_allowed("runner_state"):
                self._set_runner_state(message.runner, RunnerState.DRAINING, reason)

        self.push_screen(DrainForm(message.runner, message.preview), answered)

    @work(group="act", exit_on_error=False)
    async def _set_runner_state(self, runner: str, state: RunnerState, reason: str) -> None:
        try:
            written = await self.source.set_runner_state(runner, state, reason, self.actor)
        except FleetqError as exc:
            self.post_message(Acted(f"{runner}: {exc}", error=True))
            return
        self.post_message(Acted(f"{runner} is now {written.value} ({reason})"))

    def _schedule_state(self, *, paused: bool) -> None:
        chosen = self.query_one(SchedulesView).selected()
        if chosen is None:
            self.notify("no schedule selected", severity="warning")
            return
        if (chosen.paused_at is not None) == paused:
            self.notify(
                f"schedule {escape(chosen.name)} is already {'paused' if paused else 'firing'}",
                severity="warning",
                markup=False,
            )
            return
        name = chosen.name
        if not paused:
            body = Text("Resume schedule ")
            body.append(escape(name), style="bold")
            body.append(": it fires from the next tick on; the ticks of the pause are not fired.")

            def confirmed(yes: bool | None) -> None:
                if yes and self._acting_allowed("runner_state"):
                    self._pause_schedule(name, False, "")

            self.push_screen(Confirm(f"Resume {escape(name)}?", body), confirmed)
            return

        def reasoned(reason: str | None) -> None:
            if reason is not None and self._acting_allowed("runner_state"):
                self._pause_schedule(name, True, reason)

        self.push_screen(
            ReasonForm(
                f"Pause schedule {escape(name)}",
                "It fires nothing until resumed; jobs it fired already are untouched.",
                "Pause",
            ),
            reasoned,
        )

    @work(group="act", exit_on_error=False)
    async def _pause_schedule(self, name: str, paused: bool, reason: str) -> None:
        try:
            await self.source.pause_schedule(name, paused, reason, self.actor)
        except FleetqError as exc:
            self.post_message(Acted(f"schedule {name}: {exc}", error=True))
            return
        done = f"paused ({reason})" if paused else "resumed"
        self.post_message(Acted(f"schedule {name} {done}"))

    @on(Acted)
    @while_open
    def _acted(self, acted: Acted) -> None:
        self.notify(
            escape(acted.summary), severity="error" if acted.error else "information", markup=False
        )
        if not acted.error:
            self.post_message(Hint())


_ACTION_VIEWS: dict[str, tuple[str, ...]] = {
    "cancel_jobs": ("jobs", "detail"),
    "runner_state": ("runners", "schedules"),
}
_ACTION_NAMES = {"cancel_jobs": "cancel", "runner_state": "drain, pause and resume"}


def _why(text: str) -> str:
    """A connection error, said in a few words for the title bar."""
    low = text.lower()
    for needle, words in (
        ("password authentication failed", "authentication failed"),
        ("authentication", "authentication failed"),
        ("connection refused", "connection refused"),
        ("schema", "schema missing or out of date: run `fleetq migrate`"),
        ("does not exist", "database missing"),
        ("starting up", "the database is starting up"),
        ("shutting down", "the database is shutting down"),
        ("timed out", "timed out"),
        ("did not answer in time", "timed out"),
    ):
        if needle in low:
            return words
    return escape(text.split("\n")[0])[:80]


VIEWS_TITLE = {
    "overview": "overview",
    "lanes": "lanes",
    "jobs": "jobs",
    "detail": "job detail",
    "runners": "runners",
    "events": "events",
    "overlaps": "overlaps",
    "schedules": "schedules",
}


async def _pause(seconds: float) -> None:
    await asyncio.sleep(seconds)  # backoff between reconnects, not synchronisation


def run_console(
    dsn: str, *, readonly: bool = False, title: str | None = None, log: Path | None = None
) -> None:
    """Run the console on `dsn` until the operator quits (blocks). Meanwhile log records,
    warnings and thread exceptions go to `log` (default `screen.default_log()`), never
    over the screen."""
    with screen.owned(log or screen.default_log()):
        ConsoleApp(dsn, readonly=readonly, title=title).run()
