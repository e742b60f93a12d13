"""Untrusted text (names, reasons, payloads, job output) made safe for a terminal.

An escape sequence in a drain reason or a job's output must not move an operator's
cursor, retitle the window or hide what follows. The console strips control sequences
(`clean`); the CLI shows them escaped (`escape`), so a reader sees that something was
there and what.
"""

from __future__ import annotations

import re

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), other two-byte escapes, C1 CSI, then
# any remaining C0/C1 control character except tab and newline.
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[@-Z\\-_]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)
_CONTROL_CHAR = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_OR_NEWLINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def clean(value: object) -> str:
    """`value` as a string with every terminal control sequence removed."""
    return _CONTROL.sub("", "" if value is None else str(value))


def escape(value: object, *, one_line: bool = True) -> str:
    """`value` with each control character shown as `\\xNN` (ESC as `\\x1b`), so nothing
    reaches the terminal raw; with `one_line`, newlines and tabs are escaped too."""
    pattern = _CONTROL_OR_NEWLINE if one_line else _CONTROL_CHAR
    text = "" if value is None else str(value)
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
