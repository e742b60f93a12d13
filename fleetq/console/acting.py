"""The operator's actions: cancel jobs, drain, pause or resume a runner, pause or resume
a schedule. Each asks first (a dialog that names its targets and effect, focus on No),
then makes the same write as the CLI in a worker that only posts what it did.

Who may act is decided once, from the login's privileges (`views_may_act`): a reader
login is not offered an action that would fail "permission denied".
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING

from rich.text import Text

from fleetq.console.commands import VIEWS, VIEWS_TITLE
from fleetq.console.dialogs import Confirm, DrainForm, ReasonForm
from fleetq.console.messages import Acted, DrainPreview, Progress
from fleetq.console.text import escape
from fleetq.console.views.detail import DetailView
from fleetq.console.views.filters import describe_filter
from fleetq.console.views.jobs import JobsView
from fleetq.console.views.runners import RunnersView
from fleetq.console.views.schedules import SchedulesView
from fleetq.core.errors import FleetqError
from fleetq.core.jobpages import JobFilter
from fleetq.core.models import CancelResult, JobId, RunnerState

if TYPE_CHECKING:
    from fleetq.console.app import ConsoleApp

ACTIONS = frozenset({"cancel_jobs", "runner_state"})
ACTION_VIEWS: dict[str, tuple[str, ...]] = {
    "cancel_jobs": ("jobs", "detail"),
    "runner_state": ("runners", "schedules"),
}
ACTION_NAMES = {"cancel_jobs": "cancel", "runner_state": "drain, pause and resume"}
RUNNER_EFFECTS = {
    RunnerState.PAUSED: "it claims nothing new until resumed; what it runs now continues",
    RunnerState.ACTIVE: "it claims work again",
}
SHOWN_IDS = 12  # ids named in a cancel confirmation before "…"


class Operator:
    """The actions of one console, on its app (the app owns widgets and workers)."""

    def __init__(self, app: ConsoleApp) -> None:
        self.app = app
        self.may_cancel = True  # until the login's privileges are read
        self.may_steer = True

    def may(self, action: str) -> bool:
        """The login may do it at all (a reader may not: its actions are hidden)."""
        if self.app.readonly:
            return False
        return self.may_cancel if action == "cancel_jobs" else self.may_steer

    def shown(self, action: str) -> bool:
        """Whether `action`'s key is offered now (in its views, to a login that may)."""
        return self.may(action) and self.app.current in ACTION_VIEWS[action]

    def refused(self, action: str) -> bool:
        """Whether `action`'s key, in its own view, is refused to this login (and says so)."""
        return not self.may(action) and self.app.current in ACTION_VIEWS[action]

    def allowed(self, action: str) -> bool:
        """Whether `action` may run now; if not, say why (keys and the palette alike)."""
        app = self.app
        views = ACTION_VIEWS[action]
        if app.readonly:
            why = "read-only console (--readonly): actions are off"
        elif not self.may(action):
            why = f"this login ({app.login}) may not {ACTION_NAMES[action]}: it reads only"
        elif app.current not in views:
            where = " and ".join(f"the {VIEWS_TITLE[v]} view ({VIEWS.index(v) + 1})" for v in views)
            why = f"{ACTION_NAMES[action]} works in {where}"
        elif app.stale_since is not None or not app.ready:
            why = "not connected: actions wait until the console has resynced"
        else:
            return True
        app.notify(why, severity="warning", markup=False)
        return False

    def _work(self, run: Callable[[], Awaitable[None]]) -> None:
        self.app.run_worker(run(), group="act", exit_on_error=False)

    # ---- cancel ------------------------------------------------------------------

    def cancel_jobs(self) -> None:
        """Cancel the marked jobs (or the selected one), after a confirmation."""
        if not self.allowed("cancel_jobs"):
            return
        app = self.app
        hidden = 0
        matching = ""
        where = None
        if app.current == "detail":
            targets = [app.detail_job] if app.detail_job is not None else []
            shown = app.query_one(DetailView).detail
            known = {shown.job.id: shown.job.state} if shown is not None else {}
        else:
            view = app.query_one(JobsView)
            targets, hidden = view.targets()
            known = {j.id: j.state for j in view.page.jobs} if view.page is not None else {}
            if (where := view.marked_where) is not None:
                matching = describe_filter(where) or "no filter: every job"
        left_alone = f" {hidden} marked job(s) the filter hides are left alone." if hidden else ""
        if not targets:
            app.notify("no job selected" + (f":{left_alone}" if hidden else ""), severity="warning")
            return
        finished = [j for j in targets if j in known and known[j].terminal]
        targets = [j for j in targets if j not in finished]
        if not targets:
            states = ", ".join(f"job {j} is {known[j].value}" for j in finished[:5])
            app.notify(f"nothing to cancel: {states}", severity="warning", markup=False)
            return
        title, body = _cancel_text(targets, finished, left_alone, matching)

        def answered(yes: bool | None) -> None:
            if yes and self.allowed("cancel_jobs"):  # it may have gone stale since
                self._work(lambda: self._cancel(targets, where))
                if app.current == "jobs":
                    app.query_one(JobsView).clear_marks()  # done with: they do not linger

        app.push_screen(Confirm(title, body), answered)

    async def _cancel(self, targets: list[JobId], where: JobFilter | None) -> None:
        """Cancel `targets`; marked as every match of `where`, only those that still
        match it (a job marked queued that has started since is not cancelled unseen)."""
        app = self.app
        jobs = app.query_one(JobsView)
        moved: list[JobId] = []
        marked = len(targets)
        try:
            if where is not None:
                still = set(await app.source.job_ids(where))
                moved = [t for t in targets if t not in still]
                targets = [t for t in targets if t in still]
            total = len(targets)
            results = await app.source.cancel(
                targets, app.actor, lambda done: jobs.post_message(Progress(done, total))
            )
        except FleetqError as exc:
            app.post_message(Acted(f"cancel failed: {exc}", error=True))
            return
        pending = sum(r.stop_pending for r in results)
        changed = sum(r.previous_state != r.state for r in results)
        gone = _named([f"job {j}" for j in moved])
        left = f"; {len(moved)} no longer matched the filter, left alone ({gone})" if moved else ""
        app.post_message(
            Acted(
                f"cancelled {changed} of {marked} job(s); {pending} stop(s) pending{left}"
                + _not_cancelled(results)
            )
        )

    def copy(self) -> None:
        """Copy the selected job's id and commit (OSC 52: the terminal must allow it)."""
        app = self.app
        job = None
        if app.current == "jobs" and (selected := app.query_one(JobsView).selected()):
            page = app.query_one(JobsView).page
            job = next((j for j in page.jobs if j.id == selected), None) if page else None
        elif app.current == "detail" and (shown := app.query_one(DetailView).detail):
            job = shown.job
        if job is None:
            app.notify("no job selected to copy", severity="warning")
            return
        app.copy_to_clipboard(f"{job.id} {job.commit_sha}")
        app.notify(
            f'copied "{job.id} {job.commit_sha}" (through the terminal: if nothing was '
            "copied, it does not allow OSC 52; the id and commit are in this message)",
            markup=False,
        )

    def save_svg(self) -> None:
        """Save the screen as SVG in $FLEETQ_SCREENSHOTS (default: the current directory)."""
        app = self.app
        folder = os.environ.get("FLEETQ_SCREENSHOTS", ".")
        name = f"fleetq-console-{app.current}-{datetime.now():%Y%m%d-%H%M%S}.svg"
        path = app.save_screenshot(filename=name, path=folder)
        app.notify(f"saved {path}", title="screenshot", markup=False)

    # ---- runners and schedules ---------------------------------------------------

    def runner_state(self, state: str) -> None:
        """Drain (with a reason and a preview), pause or resume the selected runner; in
        the schedules view, pause (with a reason) or resume the selected schedule."""
        if not self.allowed("runner_state"):
            return
        app = self.app
        if app.current == "schedules":
            if state != RunnerState.DRAINING:
                self._schedule_state(paused=state == RunnerState.PAUSED)
            else:
                app.notify("a schedule is paused (p) or resumed (u)", severity="warning")
            return
        view = app.query_one(RunnersView)
        runner = view.selected()
        if runner is None:
            app.notify("no runner selected", severity="warning")
            return
        target = RunnerState(state)
        current = view.state_of(runner)
        if current == target or (target == RunnerState.DRAINING and current == RunnerState.DRAINED):
            # nothing to change, and an operator's recorded reason must not be overwritten
            app.notify(
                f"{escape(runner)} is already {current.value}", severity="warning", markup=False
            )
            return
        if target == RunnerState.ACTIVE and current is None:
            app.notify(f"{escape(runner)} is offline", severity="warning", markup=False)
            return
        if target == RunnerState.DRAINING:
            app.hold_keys("the drain form")  # a reason typed at once belongs to it
            self._work(lambda: self._preview_drain(runner))
            return
        if target == RunnerState.PAUSED:  # a reason, as for a drain (the help says so)
            app.hold_keys("the pause form")  # a reason typed at once belongs to it

            def reasoned(reason: str | None) -> None:
                if reason is not None and self.allowed("runner_state"):
                    self.set_runner_state(runner, target, reason)

            effect = RUNNER_EFFECTS[target].capitalize() + "."
            app.push_screen(ReasonForm(f"Pause runner {escape(runner)}", effect, "Pause"), reasoned)
            return
        body = Text("Resume runner ")
        body.append(escape(runner), style="bold")
        body.append(f": {RUNNER_EFFECTS[target]}.")

        def answered(yes: bool | None) -> None:
            if yes and self.allowed("runner_state"):
                self.set_runner_state(runner, target, "resumed in console")

        app.push_screen(Confirm(f"Resume {escape(runner)}?", body), answered)

    async def _preview_drain(self, runner: str) -> None:
        try:
            preview = await self.app.source.drain_preview(runner)
        except FleetqError as exc:
            self.app.post_message(Acted(f"drain preview failed: {exc}", error=True))
            return
        self.app.post_message(DrainPreview(runner, preview))

    def drain_form(self, runner: str, preview: list[tuple[int, str, str]]) -> None:
        """The drain form, once its preview is read: a reason, and an explicit Drain."""

        def answered(reason: str | None) -> None:
            if reason is not None and self.allowed("runner_state"):
                self.set_runner_state(runner, RunnerState.DRAINING, reason)

        self.app.push_screen(DrainForm(runner, preview), answered)

    def set_runner_state(self, runner: str, state: RunnerState, reason: str) -> None:
        """Write the runner's new state (a worker), as `fleetq drain` does."""

        async def run() -> None:
            app = self.app
            try:
                written = await app.source.set_runner_state(runner, state, reason, app.actor)
            except FleetqError as exc:
                app.post_message(Acted(f"{runner}: {exc}", error=True))
                return
            app.post_message(Acted(f"{runner} is now {written.value} ({reason})"))

        self._work(run)

    def _schedule_state(self, *, paused: bool) -> None:
        app = self.app
        chosen = app.query_one(SchedulesView).selected()
        if chosen is None:
            app.notify("no schedule selected", severity="warning")
            return
        if (chosen.paused_at is not None) == paused:
            app.notify(
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
                if yes and self.allowed("runner_state"):
                    self._work(lambda: self._pause_schedule(name, False, ""))

            app.push_screen(Confirm(f"Resume {escape(name)}?", body), confirmed)
            return

        def reasoned(reason: str | None) -> None:
            if reason is not None and self.allowed("runner_state"):
                self._work(lambda: self._pause_schedule(name, True, reason))

        app.push_screen(
            ReasonForm(
                f"Pause schedule {escape(name)}",
                "It fires nothing until resumed; jobs it fired already are untouched.",
                "Pause",
            ),
            reasoned,
        )

    async def _pause_schedule(self, name: str, paused: bool, reason: str) -> None:
        app = self.app
        try:
            await app.source.pause_schedule(name, paused, reason, app.actor)
        except FleetqError as exc:
            app.post_message(Acted(f"schedule {name}: {exc}", error=True))
            return
        done = f"paused ({reason})" if paused else "resumed"
        app.post_message(Acted(f"schedule {name} {done}"))


def _cancel_text(
    targets: list[JobId], finished: list[JobId], left_alone: str, matching: str
) -> tuple[str, Text]:
    """The confirmation's title and body: how many, which (the first few), under which
    filter when every match was marked, and what a cancel does."""
    ids = ", ".join(str(j) for j in targets[:SHOWN_IDS]) + (
        " …" if len(targets) > SHOWN_IDS else ""
    )
    noun = "job" if len(targets) == 1 else "jobs"
    count = f"{len(targets):,}"
    where = f" matching {matching}" if matching else ""
    # marked as every match: read again when confirmed (jobs may have ended since)
    since = " Those that no longer match when you confirm are left alone." if matching else ""
    body = Text(
        f"Cancel {count} {noun}{where}: {ids} — runners will be asked to stop them; "
        "they show stop pending until the stop is confirmed. Queued jobs are cancelled "
        "at once."
        + (f" Skipping {len(finished)} finished." if finished else "")
        + left_alone
        + since
    )
    return f"Cancel {count} {noun}{where}?", body


def _not_cancelled(results: list[CancelResult]) -> str:
    """Why some were not cancelled: they had ended (or were cancelled) before the cancel
    reached them, since the screen was read."""
    ended = [r for r in results if r.previous_state == r.state]
    if not ended:
        return ""
    named = _named([f"job {r.job_id} {r.state.value}" for r in ended])
    return f"; {len(ended)} had already ended ({named})"


def _named(items: list[str], shown: int = 5) -> str:
    """The first few items, and how many more."""
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more
