"""Keys typed ahead of the screen are kept, in order, for what they were typed at.

Why: Textual routes a key to whatever has focus when the app *reads* it, and an action
that moves the keyboard (a view switch, a dialog, a filter box) runs later, when the key
that asked for it has bubbled back up. A burst such as `:job 61⏎` or `3 j j j ⏎` typed
on a loaded machine was therefore spent on the old widget, or on a dialog that had not
mounted yet. The console now (1) runs every key that moves the keyboard as a priority
binding, so it acts before the next key is read, and (2) holds the keys read while the
target is not ready (a dialog mounting, a view whose rows are not read yet) and replays
them, in order, once it is.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import cast

from textual import events
from textual._ansi_sequences import ANSI_SEQUENCES_KEYS
from textual.widget import Widget

HOLD_LIMIT_S = 3.0  # a target that never becomes ready must not swallow the keyboard
UNHELD = frozenset({"ctrl+c"})  # quitting is never held


class TypeAhead:
    """Keys held while the keyboard's next target gets ready."""

    def __init__(self) -> None:
        self._held: list[events.Key] | None = None
        self._since = 0.0
        self.waiting_for = ""  # what the keys wait for (for logs and tests)
        self.rows = False  # for a view's rows: a read that shows them lets the keys go
        self.hold_id = 0  # each hold's own: a release names the hold it ends

    @property
    def holding(self) -> bool:
        """Keys are being held now."""
        return self._held is not None

    def hold(self, why: str, *, rows: bool = False) -> None:
        """Hold the keys read from now on until `release()`; `rows`: for a view's rows,
        which any read that shows them ends (not a dialog or a switch still to come)."""
        if self._held is None:
            self._held = []
            self._since = time.monotonic()
        self.waiting_for = why
        self.rows = rows
        self.hold_id += 1

    def keep(self, event: events.Key) -> bool:
        """Keep `event` if keys are held (True); a hold past its limit lets go."""
        if self._held is None or event.key in UNHELD:
            return False
        if time.monotonic() - self._since > HOLD_LIMIT_S:
            return False  # the caller releases what was kept, then routes this one
        self._held.append(event)
        return True

    def overdue(self) -> bool:
        """A hold has lasted past its limit."""
        return self._held is not None and time.monotonic() - self._since > HOLD_LIMIT_S

    def take(self) -> list[events.Key]:
        """End the hold; the keys it kept, oldest first."""
        held, self._held = self._held or [], None
        self.waiting_for, self.rows = "", False
        return held

    async def replay(
        self, keys: list[events.Key], route: Callable[[events.Key], Awaitable[None]]
    ) -> None:
        """Route `keys` in order; if one of them starts a new hold, keep the rest."""
        for i, key in enumerate(keys):
            if self._held is not None:
                self._held.extend(keys[i:])
                return
            await route(events.Key(key.key, key.character))


def focus_now(widget: Widget) -> None:
    """Give `widget` the keyboard at once: `Widget.focus` waits a turn of the app's
    queue, and keys read in that turn went to the widget before it."""
    widget.screen.set_focus(widget)


def unmerged(key: events.Key) -> list[events.Key]:
    """Esc and the key typed right after it, as two keys. A terminal sends Alt-x as Esc
    then x, so Esc typed quickly before a view's number (`Esc 3`: close the box, then
    the jobs view) was read as Alt-3, which nothing binds, and both keys were lost.
    Nothing in the console is bound to Alt: every Alt-key is split. Empty: not merged."""
    name = key.key
    if not name.startswith("alt+") or key.is_forwarded:
        return []
    char = key.character
    rest = char if char and char.isalnum() else name.removeprefix("alt+")  # Alt-C: "C"
    return [events.Key("escape", "\x1b"), events.Key(rest, char)]


def read_escape_digits_as_alt() -> None:
    """Esc then a digit, typed quickly, reaches the app as one sequence. Textual reads
    it as the character macOS's Option-digit gives (Esc 3 as "£", for WezTerm), so Esc
    and a view's number were both lost. Unlisted, the sequence is read as Alt-digit,
    which `unmerged` splits into the two keys. (Option-3 in WezTerm then types no "£".)"""
    keys = cast(dict[str, object], ANSI_SEQUENCES_KEYS)
    for digit in "0123456789":
        keys.pop(f"\x1b{digit}", None)
