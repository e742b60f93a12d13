"""A text panel that is drawn again only when its text changed."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static


class Panel(Static):
    """A `Static` whose `show` skips text it shows already: an update lays the whole
    screen out again, and the overview's resync and the detail's 1-s tick mostly
    bring the same text (19 layouts in 44 s of an idle overview)."""

    shown: Text | None = None

    def show(self, text: Text) -> None:
        if text != self.shown:
            self.shown = text
            self.update(text)
