"""Modal dialogs: confirmations that name targets and effect, the drain form, a runner's
hour and the `:` command line (the help is `help.py`)."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Button, DataTable, Input, Static

from fleetq.console.box import Box
from fleetq.console.text import plain
from fleetq.console.typeahead import focus_now

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


def dialog_css(name: str) -> str:
    """The shared dialog look, for one screen class (screen CSS is scoped to its type)."""
    return DIALOG_CSS.replace("DIALOG", name)


class Choice(Button):
    """A dialog's button that shows it has the focus in its own text, `[ No ]`, not only
    by colour and reverse video, which NO_COLOR and some terminals do not show."""

    def __init__(self, label: str, **options: str) -> None:
        self.choice = label
        super().__init__(Text(f"  {label}  "), **options)  # type: ignore[arg-type]

    def on_focus(self) -> None:
        self.label = Text(f"[ {self.choice} ]")

    def on_blur(self) -> None:
        self.label = Text(f"  {self.choice}  ")


class Confirm(ModalScreen[bool]):
    """Yes or no on an action that names its targets and its exact effect.

    Focus starts on No (a stray Enter does nothing harmful); Enter presses the focused
    button (Tab moves between them), `y` confirms, `n` or Esc cancels, as the line under
    the text says."""

    DEFAULT_CSS = dialog_css("Confirm")
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
                yield Choice("Yes", id="yes", variant="error")
                yield Choice("No", id="no", variant="primary")

    def on_mount(self) -> None:
        focus_now(self.query_one("#no", Button))

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class Asking(ModalScreen[str | None]):
    """A destructive action that records a reason (drain, pause a schedule).

    Focus starts on No and a bare Enter presses it: nothing happens without an explicit
    choice. What is typed while a button has focus goes into the reason field; Enter in
    the field moves to the action's button, and Enter there acts (Tab moves too)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "No", priority=True),
        Binding("left,right", "app.focus_next", "Other button", show=False),
    ]
    required = False  # an empty reason is refused (else a default is recorded)
    default_reason = ""

    def on_mount(self) -> None:
        focus_now(self.query_one("#no", Button))
        self.app.release_keys()  # type: ignore[attr-defined]

    def on_key(self, event: events.Key) -> None:
        """A printable key that reached the screen was not typed into the reason (the
        field keeps its own): a button had focus. It goes into the reason, and so does
        the keyboard."""
        if event.is_printable and event.character:
            box = self.query_one("#reason", Input)
            box.insert_text_at_cursor(event.character)
            focus_now(box)
            event.stop()
            event.prevent_default()

    def _reason(self) -> str | None:
        reason = self.query_one("#reason", Input).value.strip()
        if self.required and not reason:
            self.notify("a reason is required", severity="warning")
            focus_now(self.query_one("#reason", Input))
            return None
        return reason or self.default_reason

    @on(Input.Submitted, "#reason")
    def _submitted(self) -> None:
        """Enter in the reason moves to the button; one more, explicit Enter acts. Typed
        in one burst, that second Enter reached the box before the first moved the
        keyboard on (a third was needed): read there, it presses the button."""
        yes = self.query_one("#yes", Button)
        if self.focused is yes:
            yes.press()
        else:
            focus_now(yes)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id != "yes":
            self.dismiss(None)
        elif (reason := self._reason()) is not None:
            self.dismiss(reason)

    def action_cancel(self) -> None:
        self.dismiss(None)


KEYS_LINE = "type the reason · Enter in it: to the {verb} button · Enter there: {verb} · Esc: no"


class DrainForm(Asking):
    """Drain a runner: the reason to record, and what happens to each affected job."""

    DEFAULT_CSS = dialog_css("DrainForm")
    default_reason = "drained in console"

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
            yield Box(
                placeholder="reason (recorded with your name)", id="reason", select_on_focus=False
            )
            yield Static(Text(KEYS_LINE.format(verb="Drain"), style="dim"))
            with Horizontal(classes="buttons"):
                yield Choice("Drain", id="yes", variant="error")
                yield Choice("No", id="no", variant="primary")

    def on_mount(self) -> None:
        table: DataTable[Text | str] = self.query_one("#preview", DataTable)
        table.add_columns("job", "state", "elsewhere?")
        for job, job_state, answer in self.preview:
            table.add_row(
                str(job), job_state, plain(answer, "bold red" if answer.startswith("NO") else "")
            )
        if not self.preview:
            table.add_row("-", "-", "no running or waiting job is affected")
        super().on_mount()


class ReasonForm(Asking):
    """An action that records why (pausing a schedule): the reason is required."""

    DEFAULT_CSS = dialog_css("ReasonForm")
    required = True

    def __init__(self, title: str, effect: str, verb: str) -> None:
        super().__init__()
        self.title_text = title
        self.effect = effect
        self.verb = verb

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.title_text, style="bold"))
            yield Static(Text(self.effect))
            yield Box(
                placeholder="reason (required, recorded with your name)",
                id="reason",
                select_on_focus=False,
            )
            yield Static(Text(KEYS_LINE.format(verb=self.verb), style="dim"))
            with Horizontal(classes="buttons"):
                yield Choice(self.verb, id="yes", variant="error")
                yield Choice("No", id="no", variant="primary")


INCIDENT_KINDS = {  # event kind: what it means for the runner's hour
    "lease_expired": "lease expiries (its jobs reassigned)",
    "self_fenced": "runs it stopped, its lease out of reach",
    "overlap": "runs alive beside another run of their job",
    "released": "leases it gave up (shutdowns, after a fence)",
    "stopped": "executions stopped (superseded, cancelled)",
    "stale_rejected": "stale writes rejected",
    "lost": "runs reported lost",
}


# Kinds that look alarming and are not: counted, never marked as incidents.
BENIGN_KINDS = {"stale_self_race": "a renewal that raced its own outcome"}


class HourSheet(ModalScreen[bool]):
    """A runner's last hour: its events counted by kind, incidents first; `e` lists them."""

    DEFAULT_CSS = dialog_css("HourSheet")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,h", "close(False)", "Close", priority=True),
        Binding("e,enter", "close(True)", "Its events", priority=True),
    ]

    def __init__(self, runner: str, kinds: list[tuple[str, int, datetime]]) -> None:
        super().__init__()
        self.runner = runner
        self.kinds = kinds

    def compose(self) -> ComposeResult:
        with Vertical():
            title = Text("The last hour of ", style="bold")
            title.append(plain(self.runner, "bold"))
            yield Static(title)
            yield Static(hour_text(self.kinds))
            yield Static(Text("e or Enter: these events in the events view    Esc: close", "dim"))

    def on_mount(self) -> None:
        self.app.release_keys()  # type: ignore[attr-defined]  # held by `h`

    def action_close(self, events: bool) -> None:
        self.dismiss(events)


def hour_text(kinds: list[tuple[str, int, datetime]]) -> Text:
    """Incident kinds first (with a ▲, and 0 when none happened), then the rest."""
    counts = {kind: (n, last) for kind, n, last in kinds}
    text = Text()
    for kind, meaning in INCIDENT_KINDS.items():
        n, last = counts.pop(kind, (0, None))
        text.append("▲ " if n else "  ", style="bold")
        text.append(f"{kind:18} {n:6}  {meaning:44}", style="bold" if n else "")
        text.append(f"   last at {last:%H:%M:%S}\n" if last else "\n")
    for kind, (n, last) in counts.items():
        meaning = BENIGN_KINDS.get(kind, "")
        text.append(f"  {kind:18} {n:6}  {meaning:44}   last at {last:%H:%M:%S}\n")
    text.rstrip()
    return text


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
        yield Box(
            placeholder=":overview :lanes :jobs state:running :runners :events :overlaps "
            ":job 42 :quit",
            suggester=SuggestFromList(COMMANDS, case_sensitive=False),
        )

    def on_mount(self) -> None:
        line = self.query_one(Input)
        line.value = ":"
        line.cursor_position = 1
        focus_now(line)
        self.app.release_keys()  # type: ignore[attr-defined]  # keys typed after `:`

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip().lstrip(":").strip().lower() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
