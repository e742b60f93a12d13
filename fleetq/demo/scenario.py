"""The demo's fleet configuration and its job stream.

Two projects on local repositories (`webapp`, a release gate, and `tools`), two lanes,
four submitting identities (one release-verification service, so all three priority
classes show), and a stream of submits paced over the run: a mix of quick, slow,
browser, failing and hanging checks plus control-lane handlers, some repeated with the
same idempotency key (a client retrying) and once two identical submits at the same
instant. Faults run beside it (`faults`).
"""

from __future__ import annotations

import asyncio
import json
import random
import shlex
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleetq.core import producer, report
from fleetq.core.driver import Driver, open_driver
from fleetq.core.models import SubmitResult
from fleetq.demo import faults
from fleetq.demo.fleet import Fleet
from fleetq.demo.plan import Clock, Plan, RunLog
from fleetq.demo.repo import DemoRepo

PROJECTS = {"webapp": True, "tools": False}  # name -> release gate
IDENTITIES = {"release-bot": 10, "ci": 55, "alice": 20, "bob": 15}  # name -> share of submits

# operation -> (weight in the stream, projects that allow it)
MIX: dict[str, tuple[int, tuple[str, ...]]] = {
    "unit": (30, ("webapp", "tools")),
    "integration": (18, ("webapp", "tools")),
    "browser": (14, ("webapp",)),
    "lint": (8, ("webapp", "tools")),
    "staging": (6, ("webapp", "tools")),
    "publish": (12, ("webapp",)),
    "notify": (12, ("tools",)),
}
REPEAT_EVERY = 9  # every ninth submit retries an earlier one with the same key


def fleet_toml(repos: dict[str, DemoRepo], *, lease_s: int) -> str:
    """The demo's configuration file (written next to the demo's data for anyone to read
    and re-apply with `fleetq apply`)."""
    py = shlex.quote(sys.executable)  # the interpreter the demo runs on: it surely exists

    def check(module: str, **extra: object) -> dict[str, object]:
        return {"lane": "checks", "command": f"{py} -B -m checks.{module}", **extra}

    operations: dict[str, dict[str, object]] = {
        "unit": check("unit", memory_mb=256, cpus=0.5, timeout_seconds=60),
        "integration": check("integration", memory_mb=512, cpus=1, timeout_seconds=60),
        "browser": check(
            "browser", capabilities=["browser"], memory_mb=1536, cpus=1, timeout_seconds=60
        ),
        "lint": check("lint", memory_mb=128, cpus=0.25, timeout_seconds=60),
        "staging": check("staging", memory_mb=128, cpus=0.25, timeout_seconds=2),
        "publish": {"lane": "control", "handler": "fleetq.runner.handlers:publish"},
        "notify": {"lane": "control", "handler": "fleetq.runner.handlers:echo"},
    }
    lines = [
        "# fleetq demo configuration (written by `fleetq demo`; re-apply with `fleetq apply`)",
        "[settings]",
        f"lease_seconds = {lease_s}  # short, so a frozen runner loses its jobs quickly",
        "runner_offline_after_seconds = 5",
        "reassignment_cap = 5",
        "[lanes.checks]",
        'description = "Checks of an exact commit: unit, integration, browser, lint, staging"',
        "[lanes.control]",
        'description = "Short control operations that never wait behind a long check"',
        "[identities.release-bot]",
        'role = "release-verification"',
        "[identities.ci]",
        'role = "service"',
        "[identities.alice]",
        'role = "operator"',
        "[identities.bob]",
        'role = "operator"',
    ]
    for project, gate in PROJECTS.items():
        lines += [
            f"[projects.{project}]",
            f"repository = {json.dumps(str(repos[project].path))}",
            f"release_gate = {'true' if gate else 'false'}",
        ]
        for name, (_, allowed) in MIX.items():
            if project in allowed:
                lines.append(f"[projects.{project}.operations.{name}]")
                lines += [f"{k} = {json.dumps(v)}" for k, v in operations[name].items()]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Request:
    """One submit the stream makes (a repeat sends the same one again)."""

    project: str
    operation: str
    commit: str
    identity: str
    key: str
    payload: dict[str, object] | None = None


class Stream:
    """Draws submits from the mix; seeded by the run's tag, so a run can be replayed."""

    def __init__(self, tag: str, repos: dict[str, DemoRepo]) -> None:
        self.tag = tag
        self.repos = repos
        self.rng = random.Random(tag)  # noqa: S311 - a replayable job mix, not a secret
        self.sent: list[Request] = []

    def next(self) -> Request:
        """The next submit: every REPEAT_EVERY-th repeats an earlier one."""
        if self.sent and len(self.sent) % REPEAT_EVERY == REPEAT_EVERY - 1:
            request = self.rng.choice(self.sent[-20:])
        else:
            operation = self.rng.choices(list(MIX), [w for w, _ in MIX.values()])[0]
            request = self.fresh(operation, self.rng.choice(MIX[operation][1]))
        self.sent.append(request)
        return request

    def fresh(self, operation: str, project: str, identity: str | None = None) -> Request:
        """A new request (its own idempotency key)."""
        commits = self.repos[project].commits
        # mostly the newest commit, as in CI; sometimes an older one (one has a bug)
        commit = commits[-1] if self.rng.random() < 0.5 else self.rng.choice(commits)
        who = identity or self.rng.choices(list(IDENTITIES), list(IDENTITIES.values()))[0]
        payload: dict[str, object] | None = {"seconds": 1.0} if operation == "publish" else None
        key = f"{who}-{self.tag}-{len(self.sent) + 1}"
        return Request(project, operation, commit, who, key, payload)


async def submit(driver: Driver, log: RunLog, request: Request) -> SubmitResult:
    """Submit and record the accepted job; a repeat comes back with `created=False`."""
    result = await producer.submit(
        driver,
        project=request.project,
        operation=request.operation,
        commit=request.commit,
        submitted_by=request.identity,
        idempotency_key=request.key,
        payload=request.payload,
    )
    log.submits += 1
    log.repeats += not result.created
    log.jobs.add(result.job_id)
    return result


async def run(
    dsn: str,
    plan: Plan,
    fleet: Fleet,
    repos: dict[str, DemoRepo],
    log: RunLog,
    stop: threading.Event,
    say: Callable[[str], None],
) -> None:
    """The job stream, the faults and progress lines, until the duration or `stop`."""
    clock = Clock(stop, say)
    stream = Stream(log.tag, repos)

    async def burst(driver: Driver) -> list[int]:
        """Release verification checks both projects: slow checks that jump the queue."""
        requests = [stream.fresh("integration", p, "release-bot") for p in PROJECTS]
        stream.sent.extend(requests)
        return [(await submit(driver, log, r)).job_id for r in requests]

    async with open_driver(dsn) as driver, open_driver(dsn) as second, open_driver(dsn) as watch:
        log.started_at = await report.clock(driver)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(_submits(driver, second, plan, stream, log, clock))
            tg.create_task(faults.inject(dsn, plan, fleet, burst, log, clock))
            tg.create_task(_progress(watch, plan, log, clock))
    clock.say(f"stream over: {log.submits} submits, {len(log.jobs)} jobs accepted")


async def _submits(
    driver: Driver, second: Driver, plan: Plan, stream: Stream, log: RunLog, clock: Clock
) -> None:
    n = 0
    while await clock.until(n * plan.submit_every_s) and clock.now() < plan.duration_s:
        n += 1
        if n == 12:
            await _racing_pair(driver, second, stream, log, clock)
            continue
        await submit(driver, log, stream.next())


async def _racing_pair(
    driver: Driver, second: Driver, stream: Stream, log: RunLog, clock: Clock
) -> None:
    """Two clients send the same request at the same instant: one job comes of it."""
    request = stream.fresh("unit", "webapp", "ci")
    stream.sent.append(request)
    a, b = await asyncio.gather(submit(driver, log, request), submit(second, log, request))
    clock.say(
        f"two identical submits at once (key {request.key}): jobs {a.job_id} and {b.job_id}, "
        f"created {a.created} and {b.created}"
    )


async def _progress(driver: Driver, plan: Plan, log: RunLog, clock: Clock) -> None:
    step = 1
    while await clock.until(step * plan.progress_every_s) and clock.now() < plan.duration_s:
        step += 1
        counts: Counter[str] = Counter()
        for s in await report.states(driver, sorted(log.jobs)):
            counts[s.state] += s.jobs  # failed comes in one row per reason
        done = {k: v for k, v in counts.items() if k not in ("queued", "claimed", "running")}
        clock.say(
            f"submitted {log.submits} ({log.repeats} repeats) · queued {counts.get('queued', 0)}"
            f" · running {counts.get('claimed', 0) + counts.get('running', 0)}"
            f" · done {sum(done.values())}"
            + (f" ({', '.join(f'{v} {k}' for k, v in sorted(done.items()))})" if done else "")
        )


def write_config(path: Path, repos: dict[str, DemoRepo], *, lease_s: int) -> Path:
    """Write the configuration file; returns its path."""
    path.write_text(fleet_toml(repos, lease_s=lease_s))
    return path
