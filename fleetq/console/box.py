"""A text box whose own keys act in the order they were typed."""

from __future__ import annotations

from textual import events
from textual.widgets import Input


class Box(Input):
    """An `Input` that runs its own key bindings (Ctrl-U, Ctrl-W, Home, Enter…) as it
    reads them. As bindings they ran after the characters typed right after them, so `/`,
    Ctrl-U and `state:queued⏎` in one burst deleted the filter it had just typed."""

    async def _on_key(self, event: events.Key) -> None:
        for binding in self._bindings.key_to_bindings.get(event.key, ()):
            event.stop()
            event.prevent_default()
            await self.run_action(binding.action)
            return
        await super()._on_key(event)
