"""Untrusted text (names, reasons, payloads, job output) made safe for a terminal.

Whatever the database holds may have been written before submit refused control
characters, by an administrator, or by a job (its output): an escape sequence in it must
not retitle the window or write the clipboard (OSC 0, OSC 52), move the cursor or clear
the screen, a CR or LF must not start a line of its own that reads like fleetq's, and a
bidirectional override must not reorder what follows it. `escape` is the one function
every such string passes through on its way to a terminal, in the CLI and the console
alike: each of those characters is shown as text (`\\x1b`, `\\r`, `\\u202e`), so a reader
sees that something was there and what, and nothing acts.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls (0x9b is a CSI on its own); the
# bidirectional formatting characters (they reorder the rest of a line as shown: the
# "Trojan Source" trick); the Unicode line and paragraph separators (some renderers
# break lines there).
_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_MULTI_LINE = re.compile(f"[{_UNSAFE}]")
_ONE_LINE = re.compile(f"[\t\n{_UNSAFE}]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _shown(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def escape(value: object, *, one_line: bool = True) -> str:
    """`value` as text with nothing in it that a terminal acts on: each control, bidi
    or line-separator character shown as `\\r`, `\\n`, `\\t`, `\\xNN` (ESC is `\\x1b`) or
    `\\uNNNN`. With `one_line` (a name, a reason, a table cell), newline and tab are shown
    so too, so the value cannot start a line; without it (a job's output, which has
    lines of its own) they are kept. Idempotent: what it returns holds nothing to escape."""
    pattern = _ONE_LINE if one_line else _MULTI_LINE
    return pattern.sub(_shown, "" if value is None else str(value))
