"""The help sheet: every key, by what it is for, in two columns that keep their places
when a narrow terminal wraps a line (a wrapped line went back to column 0, under the
section names, at 80 columns)."""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from fleetq.console.dialogs import dialog_css
from fleetq.console.typeahead import focus_now

SECTION = 13  # the width of HELP's section names, with their gap

HELP = """\
Views        1 overview  2 lanes  3 jobs  4 job detail  5 runners  6 events  7 overlaps
             8 schedules
             :name switches too (:overview :lanes :jobs :runners :events :overlaps :quit),
             :job 42 (or :42) opens a job's detail;  Esc or Backspace goes back
Moving       arrows or j/k, PageUp/PageDown, g/Home first row, G/End last row
Jobs         / filter: lane: state: project: runner: reassigned>0 lost>0, and one free
             word (a job id, commit prefix, operation, project or submitter);
             :jobs state:running works from anywhere (→ completes)
             space mark   v mark a range   A mark every job the filter matches
             Esc closes the box, then clears the marks, then the filter you typed
             Enter open detail
Events       / searches the whole history on the server: runner:node-a/r1 job:61
             kind:lease_expired since:30m until:12:05 (a bare id, runner or kind
             works too); n reads the next, older page; Esc back to the live tail
             Enter opens the event's job
Job detail   / shows only the output lines holding a word (Esc shows all again)
Overlaps     every window two executions of one job ran at once; Enter opens the job
Schedules    next tick, last job fired (Enter opens it); p pause (a reason), u resume
Drill down   Enter on a runner: its jobs (e: its events, h: its last hour: lease
             expiries, self-fences, stops, stale writes); Enter on a lane: its jobs
Overview     a: the jobs behind the alerts (stops, overlaps, jobs no runner can take);
             Enter opens one
Lanes        the highlighted lane's runners (who can claim its work now, why not the
             others) and its queue depth and wait by class, a column a minute, 60 min
Screen       Z freezes it (Z again thaws; r reloads)   c copies the job's id and commit
             w (jobs) every column or the narrow set   s (jobs) sort: newest, oldest,
             state (running first), lease left, lost/reassigned
Actions      C cancel the marked jobs (or the one under the cursor)
             d drain   p pause   u resume the runner under the cursor (view 5)
             every action asks first, focus on No: y yes, n/Esc no, Enter the
             focused button; drain and pause take a reason: type it, Enter moves
             to the button, Enter again acts. Hidden with --readonly and for a
             reader login
Anywhere     r reload now   Ctrl-s save an SVG screenshot   Ctrl-p palette   ? or F1 help
             q or Ctrl-c quit

Live: the console LISTENs to the database; a lost connection shows "stale since" in the
title bar and disables actions until it has reconnected and read everything again.
"""


def help_sheet() -> RenderableType:
    """HELP as a grid: a section's name, and each of its lines wrapping in its own column
    (a line stays one item: joined, "A mark every job the filter matches Esc closes the
    box" ran two keys together)."""
    body, _, tail = HELP.partition("\n\n")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, width=SECTION - 1)
    grid.add_column(ratio=1)
    for line in body.splitlines():
        grid.add_row(Text(line[:SECTION].strip(), "bold"), Text(line[SECTION:]))
    return Group(grid, Text(""), Text(" ".join(tail.split())))


class Help(ModalScreen[None]):
    """Every key; it scrolls (j/k, arrows, PgUp/PgDn, g/G) when the terminal is short."""

    DEFAULT_CSS = (
        dialog_css("Help")
        + """
    Help > Vertical { height: 1fr; }
    Help VerticalScroll { height: 1fr; }
    """
    )
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark,f1", "close", "Close", priority=True),
        Binding("j", "scroll('down')", "Down", show=False),
        Binding("k", "scroll('up')", "Up", show=False),
        Binding("g", "scroll('home')", "Top", show=False),
        Binding("G", "scroll('end')", "End", show=False),
    ]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text("fleetq-console keys (j/k, PgUp/PgDn scroll; Esc closes)", "bold"))
            with VerticalScroll(id="help-body"):
                yield Static(help_sheet())

    def on_mount(self) -> None:
        focus_now(self.query_one("#help-body", VerticalScroll))

    def action_scroll(self, where: str) -> None:
        body = self.query_one("#help-body", VerticalScroll)
        {"down": body.scroll_down, "up": body.scroll_up}.get(where, lambda: None)()
        if where == "home":
            body.scroll_home(animate=False)
        elif where == "end":
            body.scroll_end(animate=False)

    def action_close(self) -> None:
        self.dismiss(None)
