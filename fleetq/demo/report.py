"""The demo's report, and its verdict.

Figures come from the database (`fleetq.core.report`), about this run's jobs only. The
verdict fails the run (exit 1) for what must never happen: an accepted job the database
no longer knows (lost), a job still live after the settle deadline (the queue did not
drain: not lost, but not accounted for either), an accepted fenced-ledger write behind a
newer token, or a runner process that had to be killed or outlived the demo. A fault that
produced no overlap or no confirmed superseded stop is a warning: timing on a loaded
machine can make the frozen runner's job end first, and that is no fault of the queue.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from fleetq.cli.output import table
from fleetq.core.report import RunFigures
from fleetq.demo.plan import Plan, RunLog


@dataclass
class Verdict:
    """Failures make the exit status 1; warnings are printed only."""

    proved: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No failure."""
        return not self.failures


def judge(fig: RunFigures, log: RunLog, problems: list[str]) -> Verdict:
    """What the run proved, and what it did not."""
    v = Verdict()
    if fig.lost:
        v.failures.append(f"{fig.lost} accepted job(s) LOST: the database does not know them")
    if fig.unsettled:
        ids = ", ".join(str(j.job_id) for j in fig.live[:10])
        v.failures.append(f"{fig.unsettled} job(s) still live after the settle deadline: {ids}")
    if not (fig.lost or fig.unsettled):
        v.proved.append(f"all {fig.accepted} accepted jobs accounted for (terminal)")
    if fig.ledger_violations:
        v.failures.append(f"{fig.ledger_violations} fenced-ledger violation(s)")
    else:
        v.proved.append("no fenced-ledger violation")
    v.failures += problems
    if not problems:
        v.proved.append("runners drained and stopped, no stray process")
    _judge_fault(fig, log, v)
    return v


def _judge_fault(fig: RunFigures, log: RunLog, v: Verdict) -> None:
    if log.fault is None:
        v.warnings.append("no fault was injected (the run was stopped before it)")
        return
    held = set(log.fault.held)
    superseded = [s for s in fig.superseded_confirmed() if s.runner_id == log.fault.runner]
    reassigned = [r for r in fig.recoveries if r.job_id in held and r.claimed_again_at]
    if reassigned and superseded:
        v.proved.append(
            f"{len(reassigned)} reassignment(s), {len(superseded)} superseded stop(s) confirmed"
        )
    else:
        v.warnings.append(
            f"the fault gave {len(reassigned)} reassignment(s) and {len(superseded)} confirmed "
            "superseded stop(s) (the frozen runner's jobs may have ended first)"
        )
    confirmed = [o for o in fig.overlaps if o.job_id in held and o.end_confirmed and o.happened]
    if confirmed:
        longest = max(o.seconds(fig.read_at) for o in confirmed)
        v.proved.append(f"overlap window measured ({longest:.3f}s, end confirmed)")
    else:
        v.warnings.append(
            "the fault produced no measured overlap window with a confirmed end (the frozen "
            "runner's runs ended unseen during the freeze: their windows are bounds, ≤)"
        )


def render(
    fig: RunFigures, log: RunLog, plan: Plan, verdict: Verdict, *, wall_s: float, settle_s: float
) -> str:
    """The report as printed at the end of the demo."""
    sections = [
        _header(fig, log, plan, wall_s=wall_s, settle_s=settle_s),
        _jobs(fig, log),
        _queue_wait(fig),
        _phases(fig),
        _placement(fig),
        _completed(fig),
        _recovery(fig, log, plan),
        _overlaps(fig),
        _fencing(fig, log),
        _verdict(verdict),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def _header(fig: RunFigures, log: RunLog, plan: Plan, *, wall_s: float, settle_s: float) -> str:
    return (
        f"fleetq demo report (run {log.tag}): {plan.duration_s:.0f}s job stream, "
        f"{settle_s:.1f}s to settle, {wall_s:.1f}s in all; lease {plan.lease_s}s"
    )


def _jobs(fig: RunFigures, log: RunLog) -> str:
    by_state: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for s in fig.states:
        by_state[s.state] += s.jobs
        if s.state == "failed":
            failed[s.reason or "exit"] += s.jobs
    reasons = ", ".join(f"{n} {r}" for r, n in sorted(failed.items()))
    outcome = " · ".join(
        f"{by_state[state]} {state}" + (f" ({reasons})" if state == "failed" and reasons else "")
        for state in ("succeeded", "failed", "cancelled", "refused")
    )
    live = fig.unsettled
    accounted = (
        "every accepted job is accounted for"
        if not (fig.lost or live)
        else (f"{fig.lost} lost, {live} still live")
    )
    return (
        f"jobs: {fig.accepted} accepted from {log.submits} submits ({log.repeats} repeated "
        f"with the same idempotency key, answered with the existing job)\n"
        f"  {outcome}\n  {accounted}: {fig.found} of {fig.accepted} found, {live} live"
    )


def _queue_wait(fig: RunFigures) -> str:
    if not fig.queue_wait:
        return ""
    rows = [
        [w.priority_class, w.project, w.jobs, f"{w.p50_s:.2f}", f"{w.p95_s:.2f}", f"{w.max_s:.2f}"]
        for w in fig.queue_wait
    ]
    return "queue wait, submit to first claim (class 0 release verification, 1 release gate):\n" + (
        _indent(table(["class", "project", "jobs", "p50 s", "p95 s", "max s"], rows))
    )


def _phases(fig: RunFigures) -> str:
    if not fig.phases:
        return ""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    rows = [
        [
            p.operation,
            p.runs,
            ms(p.prepare_p50_ms),
            ms(p.prepare_max_ms),
            ms(p.run_p50_ms),
            ms(p.run_max_ms),
        ]
        for p in fig.phases
    ]
    headers = ["operation", "runs", "prepare p50", "prepare max", "run p50", "run max"]
    return "prepare (stage the commit) vs run, ms, per execution:\n" + _indent(table(headers, rows))


def _placement(fig: RunFigures) -> str:
    if not fig.placement:
        return ""
    runners = sorted({p.runner_id for p in fig.placement})
    operations = sorted({p.operation for p in fig.placement})
    claims = {(p.runner_id, p.operation): p.claims for p in fig.placement}
    rows = [[op, *(claims.get((r, op), "-") for r in runners)] for op in operations]
    return (
        "claims per runner (eligibility at work: no browser check on a runner without one):\n"
        + (_indent(table(["operation", *runners], rows)))
    )


def _completed(fig: RunFigures) -> str:
    if not fig.completed:
        return ""
    step = fig.interval_s
    widest = max((c.succeeded + c.failed for c in fig.completed), default=0) or 1
    lines = []
    for c in fig.completed:
        span = f"{c.bucket * step:.0f}-{(c.bucket + 1) * step:.0f}s"
        bar = "#" * round(30 * (c.succeeded + c.failed) / widest)
        lines.append(f"{span:>9} {c.succeeded:3d} succeeded {c.failed:3d} failed  {bar}")
    return f"completed per {step:.0f}s (outcomes recorded):\n" + _indent("\n".join(lines))


def _recovery(fig: RunFigures, log: RunLog, plan: Plan) -> str:
    lines: list[str] = []
    f = log.fault
    if f is not None:
        healed = (
            f"SIGCONT after {(f.healed_at - f.frozen_at).total_seconds():.1f}s"
            if f.healed_at
            else "never resumed"
        )
        lines.append(f"fault: SIGSTOP {f.runner} holding jobs {f.held}; {healed}")
    for r in fig.recoveries:
        since = f", {(r.at - f.frozen_at).total_seconds():.1f}s after SIGSTOP" if f else ""
        again = (
            f"claimed again by {r.claimed_by} {r.delay_s:.2f}s later"
            if r.delay_s is not None
            else "not claimed again"
        )
        lines.append(
            f"job {r.job_id}: {r.kind} (token {r.lease_version}, {r.lost_by}{since}); {again}"
        )
    delays = sorted(r.delay_s for r in fig.recoveries if r.delay_s is not None)
    if delays:
        lines.append(
            f"recovery delay (lease expiry to next claim): p50 {delays[len(delays) // 2]:.2f}s, "
            f"max {delays[-1]:.2f}s over {len(delays)} reassignment(s)"
        )
    claimed = [r.claimed_again_at for r in fig.recoveries if f and r.job_id in f.held]
    if f is not None and (again_at := [at for at in claimed if at is not None]):
        first = (min(again_at) - f.frozen_at).total_seconds()
        lines.append(
            f"from SIGSTOP to the first of its jobs claimed again: {first:.2f}s (lease "
            f"{plan.lease_s}s from the last heartbeat, then a reaper pass)"
        )
    stops = Counter(
        (s.stop_reason, "confirmed" if s.stop_confirmed else "NOT confirmed") for s in fig.stops
    )
    if stops:
        lines.append(
            "stops: " + ", ".join(f"{n} {reason} ({c})" for (reason, c), n in sorted(stops.items()))
        )
    if log.cancelled is not None:
        lines.append(f"operator cancel: job {log.cancelled}")
    return "recovery:\n" + _indent("\n".join(lines)) if lines else "recovery: no incidents"


def _overlaps(fig: RunFigures) -> str:
    if not fig.overlaps:
        return "overlap windows: none"
    rows = [
        [
            o.job_id,
            f"{o.older_token}/{o.newer_token}",
            f"{o.older_runner} / {o.newer_runner}",
            f"{'' if o.happened else '≤'}{o.seconds(fig.read_at):.3f}",  # ≤: a bound
            "open" if o.open else ("confirmed" if o.end_confirmed else "unconfirmed"),
            o.older_stop_reason or "-",
        ]
        for o in fig.overlaps
    ]
    headers = ["job", "tokens", "runners", "seconds", "end", "older stopped as"]
    return "overlap windows (two executions of one job alive at once):\n" + _indent(
        table(headers, rows)
    )


def _fencing(fig: RunFigures, log: RunLog) -> str:
    stale = sum(fig.stale_rejections.values())
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(fig.stale_rejections.items()))
    return (
        f"zombie writes refused: {stale}"
        + (f" ({kinds})" if kinds else "")
        + f"; races with a runner's own outcome: {fig.self_races}\n"
        f"fenced ledger: {fig.ledger_writes} writes, {fig.ledger_refused} refused as stale, "
        f"{fig.ledger_violations} violations, {fig.ledger_duplicates} job(s) with effects "
        "under two tokens"
    )


def _verdict(v: Verdict) -> str:
    head = "verdict: OK" if v.ok else "verdict: FAILED"
    lines = [f"  proved: {p}" for p in v.proved]
    lines += [f"  FAIL: {f}" for f in v.failures] + [f"  warning: {w}" for w in v.warnings]
    return "\n".join([head, *lines])


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
