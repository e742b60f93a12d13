"""The console's global keys: views by number, actions, and the keys that move the
keyboard (off while typing in a box, so `3` types a 3)."""

from __future__ import annotations

from textual.binding import Binding, BindingType

from fleetq.console.commands import VIEWS

# off while typing in a box
KEYBOARD_MOVERS = frozenset({"view", "switch", "command_line", "help"})

# Help and Quit first, then the view's actions: a narrow footer cuts from the right, and
# those must stay (the views' numbers are in the help and the palette).
GLOBAL_BINDINGS: list[BindingType] = [
    Binding("question_mark,f1", "help", "Help", priority=True),
    Binding("q", "quit", "Quit"),
    Binding("escape,backspace", "go_back", "Back", show=False),
    # actions open a dialog: priority, so the keys typed after them wait for it
    Binding("C", "cancel_jobs", "Cancel", priority=True),
    Binding("d", "runner_state('draining')", "Drain", priority=True),
    Binding("p", "runner_state('paused')", "Pause", priority=True),
    Binding("u", "runner_state('active')", "Resume", priority=True),
    # the same keys for a login that may not: hidden, and they say why (not silent)
    Binding("C", "refused('cancel_jobs')", show=False, priority=True),
    Binding("d,p,u", "refused('runner_state')", show=False, priority=True),
    *(
        Binding(str(n), f"switch('{name}')", name.capitalize(), priority=True)
        for n, name in enumerate(VIEWS, start=1)
    ),
    Binding("colon", "command_line", ":view", show=False, priority=True),
    Binding("r", "reload", "Reload", show=False),
    Binding("Z", "freeze", "Freeze", show=False),
    Binding("c", "copy", "Copy id", show=False),
    Binding("ctrl+s", "save_svg", "Screenshot", show=False),
    Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
]
