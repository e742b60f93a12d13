"""Issue 41, finding 9, in the console: what the database holds reaches the screen
escaped, as the CLI shows it, and never as Rich markup.

The scenario's rows are overwritten with terminal escapes (window title, clipboard,
screen clear), CR/LF, C1 CSI, DEL, a right-to-left override and markup, straight in SQL
as an administrator could (or as rows older than submit's refusal hold them). Each view
is then drawn, and the screen as the terminal would get it (every segment but the
app's own cursor moves) must hold no control character but newline, and no line the
data started.
"""

from __future__ import annotations

import io
import re

from psycopg.types.json import Jsonb
from rich.console import Console
from textual.app import App
from textual.pilot import Pilot

from fleetq.core.db import connect
from tests.console.conftest import SIZE, console, show

MARK = "INJECTED"
HOSTILE = (
    "x\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b[31mred\r\n"
    f"{MARK}\x9b1m\u202eevil\x7f [red]not red[/red]\u2028end"
)
OUTPUT = "collected 1 item\n" + HOSTILE.replace(MARK, "next") + "\nlast line\n"
FORBIDDEN = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
KEPT_ON_ITS_LINE = re.compile(rf"red.{{0,12}}{MARK}")
# the window title and clipboard payloads, as text: present means shown, not acted on
SHOWN = r"x\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07"


def _poison(dsn: str, job: int) -> None:
    runner = "gpu-1/r1"
    with connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE fleetq.jobs SET requested_node = $1, idempotency_key = $1, task_id = $1, "
            "submitted_by = $1, failure_reason = $1, payload = $2 WHERE id = $3",
            [HOSTILE, Jsonb({HOSTILE: HOSTILE}), job],
        )
        conn.execute(
            "UPDATE fleetq.runners SET capabilities = capabilities || ARRAY[$1], "
            "state_reason = $1, state_actor = $1 WHERE id = $2",
            [HOSTILE, runner],
        )
        conn.execute(
            "UPDATE fleetq.verdicts SET reason = $1, log_tail = $2 WHERE job_id = $3",
            [HOSTILE, OUTPUT, job],
        )
        conn.execute(
            "INSERT INTO fleetq.events (at, kind, job_id, runner_id, lease_version, actor, "
            "detail) SELECT max(at), 'failed', $1, $2, 1, $2, $3 FROM fleetq.events",
            [job, HOSTILE, Jsonb({"reason": HOSTILE, HOSTILE: HOSTILE})],
        )
        conn.execute(
            "UPDATE fleetq.schedules SET paused_by = $1, paused_reason = $1, "
            "branch = CASE WHEN branch IS NULL THEN NULL ELSE $1 END",
            [HOSTILE],
        )


def _screen(app: App[None]) -> str:
    """The screen as text, as it is sent to a terminal less the app's own control
    segments (cursor moves): what `export_screenshot` draws, without the SVG."""
    width, height = app.size
    recorder = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system="truecolor",
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    recorder.print(app.screen._compositor.render_update(full=True))
    return recorder.export_text(styles=False)


def _leaks(text: str) -> list[str]:
    found = [f"raw {c!r}" for c in sorted(set(FORBIDDEN.findall(text)))]
    found += [
        f"line started by the data: {line!r}"
        for line in text.split("\n")
        if line.count(MARK) != len(KEPT_ON_ITS_LINE.findall(line))
    ]
    return found


async def _check(pilot: Pilot[None], key: str) -> str:
    await show(pilot, key)
    screen = _screen(pilot.app)
    assert _leaks(screen) == [], screen
    return screen


async def test_every_view_shows_the_databases_text_escaped(
    fleet: tuple[str, dict[str, int]],
) -> None:
    dsn, ids = fleet
    _poison(dsn, ids["hostile"])
    app = console(dsn, job=ids["hostile"], view="detail")
    async with app.run_test(size=SIZE) as pilot:
        detail = await _check(pilot, "4")
        assert f"node {SHOWN}" in detail and f"submitted by {SHOWN}" in detail
        assert "[red]not red[/red]" in detail  # markup shown, not applied
        assert "red\\r\\nINJECTED" in detail  # the CR/LF shown where it was
        # the output keeps its own lines, and escapes the rest
        assert re.search(r"^ collected 1 item +$", detail, re.M), detail
        assert re.search(r"^ next\\x9b1m\\u202eevil", detail, re.M), detail
        for key in "127":
            await _check(pilot, key)
        for key in "3568":  # jobs, runners, events, schedules: each shows the data
            assert "x\\x1b]0;pwned" in await _check(pilot, key), key
