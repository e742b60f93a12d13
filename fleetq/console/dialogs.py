"""Modal dialogs: confirmations that name targets and effect, the drain form, help, and
the `:` command line."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Button, DataTable, Input, Static

from fleetq.console.text import plain

DIALOG_CSS = """
DIALOG { align: center middle; }
DIALOG > Vertical {
    width: 100; max-width: 95%; height: auto; max-height: 90%;
    border: thick $warning; background: $surface; padding: 1 2;
}
DIALOG .buttons { height: auto; margin-top: 1; align-horizontal: right; }
DIALOG Button { margin-left: 2; }
DIALOG DataTable { height: auto; max-height: 14; }
"""


def _css(name: str) -> str:
    """The shared dialog look, for one screen class (screen CSS is scoped to its type)."""
    return DIALOG_CSS.replace("DIALOG", name)


class Confirm(ModalScreen[bool]):
    """Yes or no on an action that names its targets and its exact effect.

    Focus starts on No (a stray Enter does nothing harmful); Enter presses the focused
    button (Tab moves between them), `y` confirms, `n` or Esc cancels, as the line under
    the text says."""

    DEFAULT_CSS = _css("Confirm")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes", priority=True),
        Binding("n", "answer(False)", "No", priority=True),
        Binding("escape", "answer(False)", "No", priority=True),
        Binding("left,right", "app.focus_next", "Other button", show=False),
    ]

    def __init__(self, title: str, body: Text | str) -> None:
        super().__init__()
        self.title_text = title
        self.body = body

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.title_text, style="bold"))
            yield Static(self.body if isinstance(self.body, Text) else plain(self.body))
            yield Static(
                Text("y: yes    n / Esc: no    Enter: the highlighted button (Tab moves)", "dim")
            )
            with Horizontal(classes="buttons"):
                yield Button("Yes", id="yes", variant="error")
                yield Button("No", id="no", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class DrainForm(ModalScreen[str | None]):
    """Drain a runner: the reason to record, and what happens to each affected job."""

    DEFAULT_CSS = _css("DrainForm")
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "No", priority=True)]

    def __init__(self, runner: str, preview: list[tuple[int, str, str]]) -> None:
        super().__init__()
        self.runner = runner
        self.preview = preview

    def compose(self) -> ComposeResult:
        with Vertical():
            title = Text("Drain runner ", style="bold")
            title.append(plain(self.runner, "bold"))
            yield Static(title)
            yield Static(
                Text(
                    "It claims nothing more; what it runs now finishes there, then it shows "
                    "drained. Affected jobs:"
                )
            )
            table: DataTable[Text | str] = DataTable(id="preview", cursor_type="none")
            yield table
            yield Input(placeholder="reason (recorded with your name), Enter to drain", id="reason")
            yield Static(Text("Enter: drain    Esc: cancel", style="dim"))
            with Horizontal(classes="buttons"):
                yield Button("Drain", id="yes", variant="error")
                yield Button("No", id="no", variant="primary")

    def on_mount(self) -> None:
        table: DataTable[Text | str] = self.query_one("#preview", DataTable)
        table.add_columns("job", "state", "elsewhere?")
        for job, job_state, answer in self.preview:
            table.add_row(
                str(job), job_state, plain(answer, "bold red" if answer.startswith("NO") else "")
            )
        if not self.preview:
            table.add_row("-", "-", "no running or waiting job is affected")
        self.query_one("#reason", Input).focus()

    def _reason(self) -> str:
        return self.query_one("#reason", Input).value.strip() or "drained in console"

    @on(Input.Submitted, "#reason")
    def _submitted(self) -> None:
        self.dismiss(self._reason())

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(self._reason() if event.button.id == "yes" else None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ReasonForm(ModalScreen[str | None]):
    """An action that records why (pausing a schedule): the reason is required."""

    DEFAULT_CSS = _css("ReasonForm")
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "No", priority=True)]

    def __init__(self, title: str, effect: str, verb: str) -> None:
        super().__init__()
        self.title_text = title
        self.effect = effect
        self.verb = verb

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.title_text, style="bold"))
            yield Static(Text(self.effect))
            yield Input(placeholder="reason (required, recorded with your name)", id="reason")
            yield Static(Text(f"Enter: {self.verb.lower()}    Esc: cancel", style="dim"))
            with Horizontal(classes="buttons"):
                yield Button(self.verb, id="yes", variant="error")
                yield Button("No", id="no", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#reason", Input).focus()

    def _answer(self) -> None:
        reason = self.query_one("#reason", Input).value.strip()
        if not reason:
            self.notify("a reason is required", severity="warning")
            return
        self.dismiss(reason)

    @on(Input.Submitted, "#reason")
    def _submitted(self) -> None:
        self._answer()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "yes":
            self._answer()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)


HELP = """\
Views        1 overview  2 lanes  3 jobs  4 job detail  5 runners  6 events  7 overlaps
             8 schedules
             :name switches too (:overview :lanes :jobs :runners :events :overlaps :quit),
             :job 42 (or :42) opens a job's detail;  Esc or Backspace goes back
Moving       arrows or j/k, PageUp/PageDown, g/Home first row, G/End last row
Jobs         / filter: lane: state: project: runner: reassigned>0 lost>0, and one free
             word (a job id, commit prefix, operation, project or submitter);
             :jobs state:running works from anywhere (→ completes)
             space mark   v mark a range
             Esc closes the filter, then clears the marks   Enter open detail
Events       / filter by words (Esc clears it)   Enter opens the event's job
Job detail   / shows only the output lines holding a word (Esc shows all again)
Overlaps     every window two executions of one job ran at once; Enter opens the job
Schedules    next tick, last job fired (Enter opens it); p pause (a reason), u resume
Drill down   Enter on a runner: its jobs (e: its events); Enter on a lane: its jobs
Lanes        the highlighted lane's runners (who can claim its work now, why not the
             others) and its queue depth and wait by class, a column a minute, 60 min
Screen       Z freezes it (Z again thaws; r reloads)   c copies the job's id and commit
             w (jobs) every column or the narrow set   s (jobs) sort: newest, oldest,
             state, lease left, lost/reassigned
Actions      C cancel the marked jobs (or the one under the cursor)
             d drain   p pause   u resume the runner under the cursor (view 5)
             every action asks first: y/Enter yes, n/Esc no; hidden with --readonly
Anywhere     r reload now   Ctrl-s save an SVG screenshot   Ctrl-p palette   ? or F1 help
             q or Ctrl-c quit

Live: the console LISTENs to the database; a lost connection shows "stale since" in the
title bar and disables actions until it has reconnected and read everything again.
"""


class Help(ModalScreen[None]):
    """Every key, on one screen."""

    DEFAULT_CSS = _css("Help")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark,f1", "close", "Close", priority=True)
    ]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text("fleetq-console keys", style="bold"))
            yield Static(Text(HELP))

    def action_close(self) -> None:
        self.dismiss(None)


# what `:` completes (→ or End takes the suggestion)
COMMANDS = [
    *(f":{view}" for view in ("overview", "lanes", "jobs", "detail", "runners", "events")),
    ":overlaps",
    ":schedules",
    ":quit",
    ":job ",
    *(
        f":jobs state:{state}"
        for state in ("queued", "claimed", "running", "succeeded", "failed", "cancelled")
    ),
    ":jobs reassigned>0",
    ":jobs lost>0",
]


class CommandLine(ModalScreen[str | None]):
    """`:name`, vi-style: a view name or quit."""

    DEFAULT_CSS = """
    CommandLine { align: left bottom; }
    CommandLine Input { width: 100%; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", priority=True)]

    def compose(self) -> ComposeResult:
        yield Input(
            placeholder=":overview :lanes :jobs state:running :runners :events :overlaps "
            ":job 42 :quit",
            suggester=SuggestFromList(COMMANDS, case_sensitive=False),
        )

    def on_mount(self) -> None:
        self.query_one(Input).value = ":"
        self.query_one(Input).focus()

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip().lstrip(":").strip().lower() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
