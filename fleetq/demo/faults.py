"""The demo's faults: a runner frozen past its lease, and an operator's cancel.

The freeze is SIGSTOP to one runner process while it runs a slow check. Its job
processes keep running (they are in sessions of their own), but the runner can neither
heartbeat nor fence itself, so its lease expires, a reaper elsewhere requeues the job and
another runner claims it under a newer token: two executions of one job are alive at once
(an overlap window). The demo waits for that window to open, then SIGCONTs it while its
slow check still runs: it finds its leases gone and stops its own executions as
superseded, confirming the stops; a confirmed end, dated as it happened, closes the
window (measured).
Every wait is on a database condition with a deadline, never a fixed sleep, so a slow
machine changes the timing, not the story.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from fleetq.core import producer, report, stats
from fleetq.core.driver import Driver, open_driver
from fleetq.demo.fleet import Fleet
from fleetq.demo.plan import Clock, Fault, Plan, RunLog

FRESH_S = 2.0  # a victim's slow check must have launched this recently: it outlives the fault
PREFER_S = 3.0  # how long to wait for the release-verification checks to be running
PICK_S = 10.0  # how long to look for such a victim before taking any busy runner
CONFIRM_S = 15.0  # how long to wait for a stop to be confirmed before saying it was not
OVERLAP_HOLD_S = 1.0  # keep the window open this long once seen, so it is measurable

Burst = Callable[[Driver], Awaitable[list[int]]]


async def inject(
    dsn: str, plan: Plan, fleet: Fleet, burst: Burst, log: RunLog, clock: Clock
) -> None:
    """Freeze a runner at the plan's fault time, heal it, then cancel a running job."""
    async with open_driver(dsn) as driver:
        if not await clock.until(plan.fault_at):
            return
        fault = await freeze(driver, plan, fleet, burst, log, clock)
        if fault is not None:
            try:
                await _await_takeover(driver, plan, fault, clock)
            finally:
                fleet.resume(fault.runner)  # even when the run is being stopped
            fault.healed_at = await report.clock(driver)
            frozen = (fault.healed_at - fault.frozen_at).total_seconds()
            clock.say(f"heal: SIGCONT {fault.runner} after {frozen:.1f}s frozen")
            await _await_stops(driver, fault.held, "superseded", clock, runner=fault.runner)
        if await clock.until(plan.cancel_at):
            await cancel_one(driver, fleet, log, clock)


async def freeze(
    driver: Driver, plan: Plan, fleet: Fleet, burst: Burst, log: RunLog, clock: Clock
) -> Fault | None:
    """SIGSTOP the runner that just launched a slow check; None if nothing runs at all."""
    fresh = await burst(driver)
    clock.say(f"release verification submits jobs {fresh} (integration, priority class 0)")
    start = clock.now()
    victim: str | None = None
    while victim is None:
        live = await report.live(driver, sorted(log.jobs))
        waited = clock.now() - start
        victim = pick_victim(
            live,
            fleet.runner_ids,
            prefer=fresh,
            strict=waited < PREFER_S,
            fallback=waited >= PICK_S,
        )
        if victim is None and (waited >= PICK_S or not await clock.sleep(0.1)):
            clock.say("fault skipped: no runner is running a job")
            return None
    fleet.pause(victim)
    frozen_at = await report.clock(driver)
    # read again now that the runner is frozen: what it holds can no longer change
    mine = [j for j in await report.live(driver, sorted(log.jobs)) if j.lease_owner == victim]
    fault = Fault(runner=victim, held=[int(j.job_id) for j in mine], frozen_at=frozen_at)
    log.fault = fault
    what = ", ".join(f"{j.job_id} {j.operation} ({j.state})" for j in mine)
    clock.say(
        f"fault: SIGSTOP {victim} (holding {what}); its processes run on, its lease "
        f"({plan.lease_s}s) will expire unrenewed"
    )
    return fault


def pick_victim(
    live: Sequence[report.LiveJob],
    runners: Sequence[str],
    *,
    prefer: Sequence[int] = (),
    strict: bool = False,
    fallback: bool = False,
) -> str | None:
    """The owner of a slow check launched within FRESH_S, so the check is still running
    when its lease has expired and the job was claimed again. One of `prefer` (priority
    class 0: claimed again first, at once) wins; with `strict`, only those will do; with
    `fallback`, the owner of any running job."""
    running = [j for j in live if j.state == "running" and j.lease_owner in runners]
    fresh = [
        j
        for j in running
        if j.operation == "integration" and j.running_s is not None and j.running_s < FRESH_S
    ]
    preferred = [j for j in fresh if j.job_id in prefer]
    for candidates in (preferred, [] if strict else fresh, running if fallback else []):
        if candidates:
            return candidates[0].lease_owner
    return None


async def _await_takeover(driver: Driver, plan: Plan, fault: Fault, clock: Clock) -> None:
    """Until a job the frozen runner held runs elsewhere too (an overlap window is open),
    then a moment more; or until the plan's heal time. Not until every job it held was
    taken over: that took up to 15 s, its slow checks ended meanwhile, unseen by the
    frozen runner, and their windows were only bounds (≤), not measured."""
    deadline = max(plan.heal_by, clock.now() + plan.lease_s + 6)
    while clock.now() < deadline:
        if not fault.overlap_seen:
            await _look_for_overlap(driver, fault, clock)
        if fault.overlap_seen:
            await clock.sleep(OVERLAP_HOLD_S)
            return
        if not await clock.sleep(0.2):
            return
    if not fault.overlap_seen:
        clock.say("no overlap opened before the heal (the frozen runner's jobs ended first)")


async def _look_for_overlap(driver: Driver, fault: Fault, clock: Clock) -> None:
    opened = [o for o in await stats.overlaps(driver, open_only=True) if o.job_id in fault.held]
    if opened:
        o = opened[0]
        fault.overlap_seen = True
        clock.say(
            f"reassigned: job {o.job_id} runs on {o.newer_runner} under token "
            f"{o.newer_token} while {o.older_runner} (token {o.older_token}) still runs "
            "it: overlap window open"
        )


async def _await_stops(
    driver: Driver, jobs: Sequence[int], reason: str, clock: Clock, *, runner: str | None = None
) -> bool:
    """Until the runner confirms a stop of one of `jobs` for `reason`; says which."""
    deadline = clock.now() + CONFIRM_S
    while clock.now() < deadline:
        stops = [
            s
            for s in await report.stops(driver, jobs)
            if s.stop_reason == reason and (runner is None or s.runner_id == runner)
        ]
        if stops and all(s.stop_confirmed for s in stops):
            for s in stops:
                clock.say(
                    f"{reason} stop confirmed: job {s.job_id} token {s.lease_version} on "
                    f"{s.runner_id} "
                    + (f"(signal {s.signal})" if s.signal else "(it had already exited)")
                )
            return True
        if not await clock.sleep(0.2):
            return False
    clock.say(f"no confirmed {reason} stop of jobs {list(jobs)} within {CONFIRM_S:.0f}s")
    return False


def pick_cancel(
    live: Sequence[report.LiveJob], runners: Sequence[str], fault: Fault | None
) -> report.LiveJob | None:
    """A running job to cancel, away from the fault's runner and jobs (so the two stories
    stay apart): a slow check if one runs, the one that started last."""
    avoid = set(fault.held) if fault else set()
    running = [
        j
        for j in live
        if j.state == "running"
        and j.lease_owner in runners
        and j.lease_owner != (fault.runner if fault else None)
        and j.job_id not in avoid
    ]
    running.sort(key=lambda j: (j.operation != "integration", j.running_s or 0))
    return running[0] if running else None


async def cancel_one(driver: Driver, fleet: Fleet, log: RunLog, clock: Clock) -> None:
    """An operator cancels a running slow check: terminal at once, "stop pending" until
    its runner confirms the process group gone."""
    deadline = clock.now() + PICK_S
    while clock.now() < deadline:
        live = await report.live(driver, sorted(log.jobs))
        job = pick_cancel(live, fleet.runner_ids, log.fault)
        if job is not None:
            answer = await producer.cancel(
                driver, job_id=job.job_id, actor="alice", reason="demo: operator cancel"
            )
            log.cancelled = job.job_id
            clock.say(
                f"cancel: alice cancels job {job.job_id} ({job.operation} on {job.lease_owner}): "
                f"{answer.state}{', stop pending' if answer.stop_pending else ''}"
            )
            await _await_stops(driver, [job.job_id], "cancelled", clock)
            return
        if not await clock.sleep(0.2):
            return
    clock.say("cancel skipped: no job was running")
