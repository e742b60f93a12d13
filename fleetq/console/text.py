"""Untrusted text made safe to show, and the small formats every view shares.

Everything a job produced or a submitter typed (names, reasons, payloads, log tails) is
untrusted: it is shown as plain `Text`, never parsed as Rich markup (so `[/bold]` in a
log is just those characters), and through `fleetq.core.text.escape`, as the CLI shows
it: a control character, CR/LF or bidi override is shown as text (`\\x1b`, `\\n`), so it
neither acts on the operator's terminal nor starts a line of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from rich.text import Text

from fleetq.core.text import escape as escape  # re-exported: the views import it from here

_BLOCKS = "▁▂▃▄▅▆▇█"


def plain(value: object, style: str = "") -> Text:
    """Untrusted `value` as literal text in `style`, on one line (escaped; no markup is
    interpreted)."""
    return Text(escape(value), style=style, no_wrap=True, overflow="ellipsis")


def lines(value: object) -> list[str]:
    """Untrusted multi-line text (a job's output) as its lines, each escaped: a lone CR
    is shown (`\\r`), not taken for a line break (as `str.splitlines` would)."""
    text = "" if value is None else str(value).replace("\r\n", "\n").removesuffix("\n")
    return [escape(line) for line in text.split("\n")] if text else []


def one_line(value: object, width: int = 60) -> str:
    """Escaped (a line break shows as `\\n`), runs of spaces folded, cut to `width`."""
    text = " ".join(escape(value).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def duration(seconds: float | None) -> str:
    """A short human duration: 850ms, 12.3s, 4m05s, 2h10m, 3d04h."""
    if seconds is None:
        return "-"
    if seconds < 0:
        return "-" + duration(-seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def age(then: datetime | None, now: datetime) -> str:
    """How long ago `then` was, by the database's clock (never negative: a heartbeat
    written after the read that dated the screen is simply 'now')."""
    return "-" if then is None else duration(max(0.0, (now - then).total_seconds()))


def bar(used: int, total: int, width: int = 10) -> Text:
    """A capacity bar: `████░░░░░░ 4/10`, red when full."""
    filled = 0 if total <= 0 else round(width * min(used, total) / total)
    style = "red" if total and used >= total else "green"
    text = Text("█" * filled, style=style)
    text.append("░" * (width - filled), style="dim")
    text.append(f" {used}/{total}")
    return text


def sparkline(values: Sequence[float | None]) -> str:
    """Values as block characters scaled to the largest; a missing value (None) is a
    blank, so a gap in the record never reads as an empty queue."""
    top = max((v for v in values if v is not None), default=0)
    steps = len(_BLOCKS) - 1

    def block(v: float | None) -> str:
        if v is None:
            return " "
        return _BLOCKS[0 if top <= 0 else min(steps, int(v * steps // top))]

    return "".join(block(v) for v in values)


STATE_STYLES = {
    "waiting": "dim yellow",
    "queued": "yellow",
    "claimed": "cyan",
    "running": "bold cyan",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
    "refused": "red",
    "active": "green",
    "paused": "yellow",
    "draining": "yellow",
    "drained": "dim",
    "offline": "bold red",
}


def state(value: str, *, suffix: str = "") -> Text:
    """A job or runner state in its colour."""
    return Text(value + suffix, style=STATE_STYLES.get(value, ""), no_wrap=True)
