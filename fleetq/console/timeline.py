"""The lease timeline of one job: one bar per execution (fencing token) on a shared time
axis, with the overlap of two executions shaded and labelled.

Built from what the database recorded: `claimed`, `started`, outcome, `lease_expired`,
`lost`, `released` and `stopped` events, and each execution's launch, stop request and
confirmed end. Heartbeats write no events (their volume would swamp the table), so the
live lease shows only its latest renewal (expiry minus the lease length).

A pure function of a `JobDetail`, so it is tested without a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from rich.text import Text

from fleetq.console.text import duration, escape
from fleetq.core.views import ExecutionRow, JobDetail

LABEL = 24
OUTCOMES = {"succeeded", "failed", "refused", "cancelled"}
ENDINGS = OUTCOMES | {"lease_expired", "lost", "released", "stopped"}
OVERLAP_STYLE = "on #5f0000"
MARKS = {
    "claim": ("C", "bold cyan"),
    "start": ("S", "bold green"),
    "heartbeat": ("h", "green"),
    "expiry": ("X", "bold red"),
    "stop_requested": ("!", "bold yellow"),
    "stop_confirmed": ("■", "bold magenta"),
    "end": ("┤", "bold"),
    "lease_ends": ("┆", "yellow"),
}
LEGEND = (
    "C claim  S start report  h last renewal  ┆ lease ends  X lease expired  "
    "! stop requested  ■ stop confirmed  ┤ end  ░ overlap"
)


@dataclass
class Lane:
    """One execution's bar: its span and the marks on it."""

    token: int
    runner: str
    claimed: datetime | None = None
    started: datetime | None = None
    ended: datetime | None = None
    end_label: str = ""
    live: bool = False
    marks: list[tuple[datetime, str]] = field(default_factory=list)


def lanes(detail: JobDetail) -> list[Lane]:
    """Each fencing token of the job with what happened to it."""
    by_token: dict[int, Lane] = {}
    executions: dict[int, ExecutionRow] = {x.lease_version: x for x in detail.executions}
    for event in detail.events:
        token = event.lease_version
        if not token:
            continue
        lane = by_token.setdefault(token, Lane(token=token, runner=event.runner_id or "?"))
        if event.kind == "claimed":
            lane.claimed = lane.claimed or event.at
            lane.runner = event.runner_id or lane.runner
            lane.marks.append((event.at, "claim"))
        elif event.kind == "started":
            lane.started = lane.started or event.at
        elif event.kind in ENDINGS and lane.ended is None:
            lane.ended = event.at
            lane.end_label = event.kind
            if event.kind == "lease_expired":
                lane.marks.append((event.at, "expiry"))
    for token, x in executions.items():
        lane = by_token.setdefault(token, Lane(token=token, runner=x.runner_id))
        lane.runner = x.runner_id
        lane.claimed = lane.claimed or x.claimed_at or x.launched_at
        lane.started = x.start_reported_at or x.launched_at or lane.started
        if x.stop_requested_at is not None:
            lane.marks.append((x.stop_requested_at, "stop_requested"))
        if x.ended_at is not None:
            lane.ended = x.ended_at
            if x.stop_reason:
                lane.end_label = x.stop_reason + (" (stop confirmed)" if x.stop_confirmed else "")
                if x.stop_confirmed:
                    lane.marks.append((x.ended_at, "stop_confirmed"))
            elif x.exit_code is not None:
                lane.end_label = f"exit {x.exit_code}"
    job = detail.job
    current = by_token.get(job.lease_version)
    if current is not None and job.state.live and current.ended is None:
        current.live = True
        if job.lease_expires_at is not None:
            current.marks.append((job.lease_expires_at, "lease_ends"))
            renewed = job.lease_expires_at - timedelta(seconds=detail.lease_seconds)
            if current.claimed is None or renewed > current.claimed:
                current.marks.append((renewed, "heartbeat"))
    for lane in by_token.values():
        if lane.started is not None and lane.claimed is not None:
            # a handler starts at its claim: its row's start is the job's claim time, a
            # hair before the claim's event (S drew left of C, "start after -0ms")
            lane.started = max(lane.started, lane.claimed)
        if lane.started is not None:
            lane.marks.append((lane.started, "start"))
        if lane.ended is not None and lane.end_label not in ("lease_expired",):
            lane.marks.append((lane.ended, "end"))
    return [by_token[t] for t in sorted(by_token)]


def render(detail: JobDetail, width: int) -> list[Text]:
    """The timeline as lines of `width` cells (label column plus the time axis)."""
    rows = lanes(detail)
    if not rows:
        return [Text("no execution yet: the job has never been claimed", style="dim")]
    axis = max(20, width - LABEL - 1)
    times = [t for lane in rows for t, _ in lane.marks]
    times += [t for lane in rows for t in (lane.claimed, lane.started, lane.ended) if t]
    t0 = min(times)
    t1 = max([*times, detail.now] if any(lane.live for lane in rows) else times)
    span = max((t1 - t0).total_seconds(), 0.001)

    def col(t: datetime) -> int:
        return min(axis - 1, max(0, round((t - t0).total_seconds() / span * (axis - 1))))

    shaded: dict[int, list[tuple[int, int]]] = {}
    for window in detail.overlaps:
        lo, hi = col(window.started_at), col(window.ended_at or detail.now)
        for token in (window.older_token, window.newer_token):
            shaded.setdefault(token, []).append((lo, hi))

    lines = [_axis(t0, t1, axis)]
    for lane in rows:
        line = Text(f"t{lane.token} ", style="bold")
        line.append(escape(lane.runner)[: LABEL - len(line) - 1].ljust(LABEL - len(line)))
        cells = [" "] * axis
        styles = [""] * axis
        start = col(lane.claimed) if lane.claimed else 0
        end = col(lane.ended or t1)
        run_from = col(lane.started) if lane.started else end + 1
        for c in range(start, end + 1):
            cells[c] = "━" if c >= run_from else "┄"
            styles[c] = "cyan" if lane.live else ""
        for t, kind in sorted(lane.marks):
            if t0 <= t <= t1:
                glyph, style = MARKS[kind]
                cells[col(t)], styles[col(t)] = glyph, style
        for lo, hi in shaded.get(lane.token, []):
            for c in range(lo, hi + 1):
                styles[c] = f"{styles[c]} {OVERLAP_STYLE}".strip()
                if cells[c] == " ":
                    cells[c] = "░"
        for glyph, style in zip(cells, styles, strict=True):
            line.append(glyph, style=style or None)
        lines.append(line)
        lines.append(Text(" " * LABEL + _describe(lane, detail.now), style="dim"))
    for window in detail.overlaps:
        lo, hi = col(window.started_at), col(window.ended_at or detail.now)
        label, style = ("overlap", "bold red") if window.happened else ("≤overlap", "yellow")
        row = Text(f"{label} t{window.older_token}∥t{window.newer_token}".ljust(LABEL), style=style)
        row.append(" " * lo)
        row.append("░" * (hi - lo + 1), style=f"{style} {OVERLAP_STYLE}")
        lines.append(row)
        pair = f"t{window.older_token}∥t{window.newer_token}"
        length = duration(window.seconds(detail.now))
        if not window.happened:
            # the older run's end was not seen: the window is a bound, maybe none at all
            lines.append(
                Text(
                    f"░ possible overlap {pair}: at most {length} ({window.unseen()})",
                    style="yellow",
                )
            )
            continue
        state = (
            "open: both may still run"
            if window.open
            else ("end confirmed" if window.end_confirmed else "end NOT confirmed")
        )
        reason = (
            f", t{window.older_token} {window.older_stop_reason}"
            if window.older_stop_reason
            else ""
        )
        lines.append(
            Text(
                f"░ overlap {pair}: {length}, {state}{reason}",
                style="bold red" if window.open or not window.end_confirmed else "bold yellow",
            )
        )
    lines.append(Text(LEGEND, style="dim"))
    return lines


def _axis(t0: datetime, t1: datetime, axis: int) -> Text:
    left = t0.strftime("%H:%M:%S.%f")[:-4]
    right = t1.strftime("%H:%M:%S.%f")[:-4]
    middle = f"{duration((t1 - t0).total_seconds())}"
    gap = max(1, axis - len(left) - len(right) - len(middle))
    text = " " * LABEL + left + " " * (gap // 2) + middle + " " * (gap - gap // 2) + right
    return Text(text, style="dim")


def _describe(lane: Lane, now: datetime) -> str:
    parts = []
    if lane.claimed and lane.started:
        parts.append(f"start after {duration((lane.started - lane.claimed).total_seconds())}")
    if lane.live:
        parts.append("live")
    elif lane.ended and lane.claimed:
        lasted = duration((lane.ended - lane.claimed).total_seconds())
        parts.append(f"{lane.end_label or 'ended'} after {lasted}")
    elif lane.end_label:
        parts.append(lane.end_label)
    else:
        parts.append("no recorded end")
    return ", ".join(parts)
