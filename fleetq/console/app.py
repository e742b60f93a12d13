"""The console application: global keys, the views, and the data flow between them.

Data flow (STYLE example 10): the `Follower` worker turns NOTIFY into coalesced `Hint`
messages; a hint starts one load (`reading.Reads`: never two at once), which posts
`Loaded`; only `@on` handlers put data into widgets. Actions (`acting.Operator`) go
through `fleetq.core`, then ask for a reload. Keys that move the keyboard are priority
bindings; keys typed ahead of their target wait for it (`typeahead`).
"""

from __future__ import annotations

import contextlib
import getpass
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import ClassVar

from textual import events, on
from textual.app import App, ComposeResult, ScreenStackError, SystemCommand
from textual.binding import BindingType
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer, Header, Input

from fleetq.console import screen
from fleetq.console.acting import ACTIONS, Operator
from fleetq.console.commands import carry_out, parse_command, subtitle, system_commands
from fleetq.console.dialogs import CommandLine
from fleetq.console.help import Help
from fleetq.console.keys import GLOBAL_BINDINGS, KEYBOARD_MOVERS
from fleetq.console.live import Follower
from fleetq.console.lookups import Lookups
from fleetq.console.messages import (
    AccessRead,
    Acted,
    AfterKeys,
    DrainPreview,
    DrillDown,
    Health,
    Hint,
    Loaded,
    Missing,
    OpenJob,
    ReleaseKeys,
    while_open,
)
from fleetq.console.reading import Reads
from fleetq.console.screenful import focus_view, show_overview, tick, view_ready
from fleetq.console.source import Source
from fleetq.console.text import escape
from fleetq.console.typeahead import HOLD_LIMIT_S, TypeAhead, read_escape_digits_as_alt, unmerged
from fleetq.console.views.detail import DetailView
from fleetq.console.views.events import EventsView
from fleetq.console.views.jobs import JobsView
from fleetq.console.views.lanes import LanesView
from fleetq.console.views.overlaps import OverlapsView
from fleetq.console.views.overview import OverviewView
from fleetq.console.views.runners import RunnersView
from fleetq.console.views.schedules import SchedulesView
from fleetq.core.jobpages import JobFilter
from fleetq.core.models import JobId
from fleetq.core.views import Overview


class ConsoleApp(App[None]):
    """`fleetq-console`."""

    TITLE = "fleetq"
    CSS = """
    Screen.stale Header { background: $error; }
    ContentSwitcher { height: 1fr; }
    App.-no-color DataTable > .datatable--cursor { text-style: bold reverse; }
    """
    BINDINGS: ClassVar[list[BindingType]] = GLOBAL_BINDINGS

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
        resync_s: float = 10.0,
    ) -> None:
        super().__init__()
        read_escape_digits_as_alt()
        if self.no_color:  # colours gone: the cursor row is reverse video, not only bold
            self._filters = screen.without_colour(self._filters)
            self.add_class("-no-color")
        self.source = Source(dsn, clock=clock)
        self.readonly = readonly
        self.actor = actor or getpass.getuser()
        self.login = ""  # the database login, once connected
        self.live = live
        self.current = view
        self.history: list[str] = []  # views left, for Esc / Backspace
        self.frozen = False  # Z: the screen holds still to be read; `r` still reloads
        self.detail_job = job
        self.where = JobFilter()
        self.stale_since: datetime | None = None
        self.stale_why = ""  # what the last failed read or connect said
        self.ready = False
        self.last_event: int | None = None
        self.db_now: tuple[datetime, float] | None = None
        self.overview: Overview | None = None
        self.outages = 0  # times the console went stale
        self.typeahead = TypeAhead()
        self.operator = Operator(self)
        self.lookups = Lookups(self)
        self.reads = Reads(self)
        self.follower = Follower(
            dsn,
            self.post_message,
            resync_s=resync_s,
            watching=lambda: self.detail_job if self.current == "detail" else None,
        )
        if title:
            self.title = title

    # ---- layout and keys -----------------------------------------------------------

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
        self.status()
        self.lookups.boot()
        focus_view(self, self.current)  # the view opened on (--view) has the keyboard
        if self.source.clock is None:
            self.set_interval(1.0, lambda: tick(self))  # ages move on

    async def on_unmount(self) -> None:
        await self.source.close()

    async def on_event(self, event: events.Event) -> None:
        """Keys typed while their target is not ready wait for it (typeahead)."""
        if isinstance(event, events.Key) and (keys := unmerged(event)):  # Esc and a key at once
            await self.on_event(keys[0])  # the key after Esc waits until Esc has acted (a box
            self.after_keys("Esc", lambda: self.post_message(keys[1]))  # closed: `5` is a view)
            return
        if isinstance(event, events.Key) and not event.is_forwarded:
            if self.typeahead.overdue():
                await self.typeahead.replay(self.typeahead.take(), self._route)
            elif self.typeahead.keep(event):
                return
            await self._route(event)  # after the replay's awaits, the app may be closing
            return
        if isinstance(event, events.Key):  # handed back by a widget: bindings next
            with contextlib.suppress(ScreenStackError):  # the app closed meanwhile
                await super().on_event(event)
            return
        await super().on_event(event)

    def hold_keys(self, why: str, *, rows: bool = False) -> None:
        """Hold the keys read from now on for `why`, at most HOLD_LIMIT_S."""
        self.typeahead.hold(why, rows=rows)
        held = self.typeahead.hold_id
        self.set_timer(HOLD_LIMIT_S, lambda: self.release_keys(held))

    def release_keys(self, held: int | None = None) -> None:
        """Hold `held`'s (default: the current) target is ready: its keys go in order."""
        if self.typeahead.holding:
            self.post_message(ReleaseKeys(self.typeahead.hold_id if held is None else held))

    @on(ReleaseKeys)
    async def _release(self, message: ReleaseKeys) -> None:
        if message.hold == self.typeahead.hold_id:
            await self.typeahead.replay(self.typeahead.take(), self._route)

    async def _route(self, key: events.Key) -> None:
        """A key, routed as typed; dropped once the app is closing (Textual raised
        ScreenStackError when held keys were replayed as the app exited)."""
        if not self.screen_stack:
            return
        with contextlib.suppress(ScreenStackError):  # the last screen went meanwhile
            await super().on_event(key)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Keys that move the keyboard are off while a box or a dialog has it (so `3`
        types a 3); actions are shown only in their views, to a login that may act."""
        typing = self.screen is not self.screen_stack[0] or isinstance(self.focused, Input)
        if action in KEYBOARD_MOVERS:
            return not typing
        if action in ACTIONS:
            return not typing and self.operator.shown(action)
        if action == "refused":
            return not typing and self.operator.refused(str(parameters[0]))
        return True

    @on(AccessRead)
    @while_open
    def _access(self, message: AccessRead) -> None:
        self.login = message.access.login
        self.operator.may_cancel = message.access.may_cancel
        self.operator.may_steer = message.access.may_steer
        self.status()

    # ---- loading (reading.Reads owns the state) -----------------------------------

    @property
    def loads(self) -> int:
        """Reads put on screen, not failed ones (tests wait on it)."""
        return self.reads.count

    @property
    def busy(self) -> bool:
        """A read is in flight or due."""
        return self.reads.busy

    @on(Hint)
    @while_open
    def _hint(self, hint: Hint) -> None:
        self.reads.hint(hint)

    @on(Loaded)
    @while_open
    def _loaded(self, loaded: Loaded) -> None:
        self.reads.loaded(loaded)

    @on(Health)
    @while_open
    def _health(self, health: Health) -> None:
        self.reads.health(health)

    @on(Missing)
    @while_open
    def _missing(self, missing: Missing) -> None:
        self.reads.missing(missing)

    def status(self) -> None:
        self.screen_stack[0].set_class(self.stale_since is not None, "stale")
        self.sub_title = subtitle(self)
        if self.stale_since is not None:
            self.query_one(OverviewView).stale(self.stale_since, self.stale_why)
        self.refresh_bindings()

    # ---- navigation ----------------------------------------------------------------

    def action_go_back(self) -> None:
        """Esc / Backspace: back to the view this one was opened from."""
        if self.history:
            self.action_view(self.history.pop(), remember=False)

    def action_view(self, name: str, remember: bool = True) -> None:
        """Switch to a view (and read it now); keys typed meanwhile wait for its rows."""
        if remember and name != self.current:
            self.history = [*self.history, self.current][-20:]
        self.current = name
        self.query_one(ContentSwitcher).current = name
        show_overview(self)
        if name == "events":
            self.query_one(EventsView).draw()
        elif name == "detail":
            self.query_one(DetailView).expect(self.detail_job)
        focus_view(self, name)
        if self.ready and self.stale_since is None and not view_ready(self):
            self.hold_keys(f"the {name} view's rows", rows=True)
        self.status()
        self.post_message(Hint())

    def action_switch(self, name: str) -> None:
        """A view's number, after the keys typed before it (`G1`: the G moves first)."""
        self.after_keys(f"the {name} view", lambda: self.action_view(name))

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
            self.query_one(EventsView).search_runner(message.runner, message.since)
            self.action_view("events")
            return
        self.show_jobs(JobFilter(runner=message.runner, lane=message.lane))

    def show_jobs(self, where: JobFilter, *, typed: bool = False) -> None:
        """The jobs view under `where` (a drill-down, or `:jobs FILTER`: typed)."""
        self.query_one(JobsView).set_filter(where, typed=typed)
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
        """`:`: keys typed at once (`:job 61⏎`) wait for the line to mount."""
        self.hold_keys("the command line")
        self.push_screen(CommandLine(), lambda line: carry_out(self, parse_command(line)))

    def action_reload(self) -> None:  # r
        self.post_message(Hint(resync=True))

    def action_freeze(self) -> None:
        """Z: hold the screen still (changes are not drawn) until Z again."""
        self.frozen = not self.frozen
        if not self.frozen and self.reads.missed:
            self.reads.missed = False
            self.post_message(Hint())
        self.status()

    def action_copy(self) -> None:  # c: the selected job's id and commit (OSC 52)
        self.operator.copy()

    def action_save_svg(self) -> None:
        """Ctrl-s: the screen as SVG in $FLEETQ_SCREENSHOTS (default: here)."""
        self.operator.save_svg()

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from system_commands(self)

    # ---- actions -------------------------------------------------------------------

    def action_cancel_jobs(self) -> None:
        """Cancel the marked jobs (or the selected one), after a confirmation."""
        self.after_keys("the cancel dialog", self.operator.cancel_jobs)

    def action_refused(self, action: str) -> None:
        self.operator.allowed(action)  # says why not

    def action_runner_state(self, state: str) -> None:
        """Drain, pause or resume the selected runner (or schedule), after asking."""
        self.after_keys(f"the {state} dialog", lambda: self.operator.runner_state(state))

    def after_keys(self, why: str, act: Callable[[], object], *, released: bool = True) -> None:
        """Run a priority key's action after the keys typed before it, queued at the
        focused widget (`jC`: C read the cursor before the j moved it), holding the keys
        typed after it; released after `act` unless it holds them itself or not
        `released` (then what it opens releases them)."""
        target = self.focused
        if target is None:
            act()
            return
        self.hold_keys(why)

        def run() -> None:
            act()
            if released and self.typeahead.waiting_for == why:
                self.release_keys()

        target.post_message(AfterKeys(run))

    @on(AfterKeys)
    def _after_keys(self, message: AfterKeys) -> None:
        message.act()

    @on(DrainPreview)
    @while_open
    def _drain_form(self, message: DrainPreview) -> None:
        self.operator.drain_form(message.runner, message.preview)

    @on(JobsView.MarkAll)
    @while_open
    def _mark_all(self, message: JobsView.MarkAll) -> None:
        self.lookups.job_ids(message.where, self.query_one(JobsView))

    @on(EventsView.Search)
    @while_open
    def _search(self, message: EventsView.Search) -> None:
        self.lookups.events(message.query, message.below, self.query_one(EventsView))

    @on(RunnersView.HourAsked)
    @while_open
    def _hour_asked(self, message: RunnersView.HourAsked) -> None:
        self.lookups.runner_hour(message.runner, self.query_one(RunnersView))

    @on(Acted)
    @while_open
    def _acted(self, acted: Acted) -> None:
        if acted.error:
            self.release_keys()  # e.g. a drain preview that failed: no form is coming
        self.notify(
            escape(acted.summary), severity="error" if acted.error else "information", markup=False
        )
        if not acted.error:
            self.post_message(Hint())
