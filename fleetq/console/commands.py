"""The views by name and the `:` command line: what a typed command asks for.

Parsing is a pure function from the typed line to a `Command`, so every form the help
names is tested without a screen; the app only carries the command out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.app import SystemCommand

from fleetq.console.text import escape
from fleetq.console.views.filters import parse_filter
from fleetq.core.jobpages import JobFilter
from fleetq.core.models import JobId

if TYPE_CHECKING:
    from fleetq.console.app import ConsoleApp

VIEWS = ("overview", "lanes", "jobs", "detail", "runners", "events", "overlaps", "schedules")
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


@dataclass(frozen=True)
class Command:
    """What a `:` line asks for: quit, a view, a job's detail, a jobs filter, or an error."""

    quit: bool = False
    view: str | None = None
    job: JobId | None = None
    where: JobFilter | None = None
    error: str | None = None


def parse_command(line: str | None) -> Command:
    """`:q`, `:jobs FILTER`, `:job 42` / `:42`, or a view's name ('' does nothing)."""
    name = (line or "").strip().lstrip(":").strip().lower()
    words = name.split()
    if name in ("q", "quit"):
        return Command(quit=True)
    if len(words) > 1 and words[0] == "jobs":  # :jobs state:running lost>0
        try:
            return Command(where=parse_filter(" ".join(words[1:])))
        except ValueError as exc:
            return Command(error=escape(str(exc)))
    if words and words[-1].isdigit() and words[0] in ("job", "detail", words[-1]):
        return Command(job=JobId(int(words[-1])))
    if not name:
        return Command()
    if name not in VIEWS:
        return Command(error=f"no view named '{escape(name)}': {', '.join(VIEWS)}")
    return Command(view=name)


def carry_out(app: ConsoleApp, command: Command) -> None:
    """Do what a `:` line asked for (a `:jobs` filter is typed: Esc clears it first)."""
    if command.quit:
        app.exit()
    elif command.error:
        app.notify(command.error, title=":", severity="error", markup=False)
    elif command.where is not None:
        app.show_jobs(command.where, typed=True)
    elif command.job is not None:
        app.detail_job = command.job
        app.action_view("detail")
    elif command.view:
        app.action_view(command.view)


def connection_trouble(text: str) -> str:
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


def system_commands(app: ConsoleApp) -> Iterator[SystemCommand]:
    """The palette's (Ctrl-p) entries: every view, and the actions this login may take."""
    for name in VIEWS:
        yield SystemCommand(
            f"View: {name}",
            f"Switch to the {VIEWS_TITLE[name]} view",
            lambda n=name: app.action_view(n),
        )
    if app.operator.may("cancel_jobs"):
        yield SystemCommand(
            "Cancel jobs", "Cancel the marked or selected jobs", app.action_cancel_jobs
        )
    if app.operator.may("runner_state"):
        for state, label in (("draining", "Drain"), ("paused", "Pause"), ("active", "Resume")):
            yield SystemCommand(
                f"{label} runner",
                f"{label} the runner under the cursor (view 5)",
                lambda s=state: app.action_runner_state(s),
            )


def subtitle(app: ConsoleApp) -> str:
    """The title bar's second line: live or stale (and why), the view, who acts."""
    if app.stale_since is not None:
        trouble = app.stale_why or "connection lost"
        return f"STALE since {app.stale_since:%H:%M:%S}: {trouble} · reconnecting, actions off"
    live = "FROZEN (Z thaws, r reloads)" if app.frozen else "live"
    if app.readonly:
        mode = "read-only"
    elif not (app.operator.may_cancel or app.operator.may_steer):
        mode = f"reader login {app.login}: watch only"
    else:
        mode = f"acting as {app.actor}"
    return f"{live if app.ready else 'connecting'} · {VIEWS_TITLE[app.current]} · {mode}"
