"""Why a job can (or cannot) run on each runner.

There is ONE eligibility rule: the SQL function `fleetq.ineligibility`, which the claim
filters on. `explain` evaluates that same function for a job against every runner and
only turns its reason codes into words with numbers, so the console's "why not
eligible" can never disagree with what a claim would do (a property test checks it).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from fleetq.core import queries
from fleetq.core.driver import Driver
from fleetq.core.models import Job, JobId

CAPACITY_REASONS = frozenset({"slots", "memory", "cpu"})


class RunnerVerdict(BaseModel):
    """One runner's answer for one job."""

    model_config = ConfigDict(frozen=True)

    runner_id: str
    node: str
    reason: str | None  # None: eligible now; else the rule's first failing reason
    lane: str
    requested_node: str | None
    needs_memory_mb: int
    needs_cpu_millis: int
    missing_capabilities: list[str]
    free_memory_mb: int
    free_cpu_millis: int
    total_memory_mb: int = 0
    total_cpu_millis: int = 0
    slots: int | None
    slots_used: int | None

    @property
    def eligible(self) -> bool:
        """The runner could claim the job now."""
        return self.reason is None

    @property
    def too_small(self) -> bool:
        """The job needs more memory or CPU than the runner has in all: it never fits."""
        return (
            self.needs_memory_mb > self.total_memory_mb
            or self.needs_cpu_millis > self.total_cpu_millis
        )

    @property
    def could_ever(self) -> bool:
        """Whether this runner, as registered, could run the job at all (when active,
        online and with room): it serves the lane, has the capabilities, is the node
        asked for and is big enough. Judged on every requirement, not only the rule's
        first failing one (an offline runner may also lack a capability)."""
        return (
            self.slots is not None
            and not self.missing_capabilities
            and (self.requested_node is None or self.requested_node == self.node)
            and not self.too_small
        )

    @property
    def group(self) -> str:
        """The reason as counted in the summary line."""
        if self.reason is None:
            return "eligible"
        if self.reason in CAPACITY_REASONS:
            return "too small" if self.too_small else "no capacity now"
        return self.describe()

    def describe(self) -> str:
        """The reason in words, with the numbers that decide it."""
        match self.reason:
            case None:
                return "eligible"
            case "lane":
                return f"does not serve lane {self.lane}"
            case "capability":
                word = "capability" if len(self.missing_capabilities) == 1 else "capabilities"
                return f"missing {word} {' and '.join(self.missing_capabilities)}"
            case "node":
                return f"job asks for node {self.requested_node}"
            case "slots":
                return f"no capacity now: {self.slots_used}/{self.slots} {self.lane} slots in use"
            case "memory" if self.needs_memory_mb > self.total_memory_mb:
                return f"too small: needs {self.needs_memory_mb} MB, has {self.total_memory_mb} MB"
            case "cpu" if self.needs_cpu_millis > self.total_cpu_millis:
                return (
                    f"too small: needs {_cpus(self.needs_cpu_millis)} CPUs, "
                    f"has {_cpus(self.total_cpu_millis)}"
                )
            case "memory":
                return (
                    f"no capacity now: needs {self.needs_memory_mb} MB, {self.free_memory_mb} free"
                )
            case "cpu":
                return (
                    f"no capacity now: needs {_cpus(self.needs_cpu_millis)} CPUs, "
                    f"{_cpus(self.free_cpu_millis)} free"
                )
            case other:
                return str(other)  # offline, paused, draining, drained


class Explanation(BaseModel):
    """Every runner's verdict for a job, and the line that sums them up."""

    model_config = ConfigDict(frozen=True)

    job_id: JobId
    runners: list[RunnerVerdict]
    at_cap: list[str] = []  # fleet-wide caps full now, e.g. "lane checks at its cap (8/8)"

    @property
    def eligible(self) -> list[str]:
        """Runners that could claim the job now."""
        return [r.runner_id for r in self.runners if r.eligible]

    @property
    def never(self) -> bool:
        """No registered runner could ever run the job (it waits for one that can)."""
        return not any(r.could_ever for r in self.runners)

    def counts(self) -> list[tuple[str, int]]:
        """Ineligible runners per reason group, most common first."""
        counts = Counter(r.group for r in self.runners if not r.eligible)
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))

    def summary(self) -> str:
        """E.g. "0/7 runners eligible: 3 missing capability browser, 2 no capacity now,
        1 draining, 1 offline" (the counts add up to the total)."""
        total = len(self.runners)
        head = f"{len(self.eligible)}/{total} runners eligible"
        caps = "".join(f"{cap}: no runner takes it until one ends; " for cap in self.at_cap)
        if not total:
            return f"{caps}{head}: no runner is registered"
        parts = [f"{n} {group}" for group, n in self.counts()]
        return f"{caps}{head}: {', '.join(parts)}" if parts else f"{caps}{head}"


async def explain(driver: Driver, job_id: JobId) -> Explanation:
    """Evaluate the claim's eligibility rule for `job_id` against every runner, and the
    fleet-wide caps its lane and project are at."""
    rows = await driver.fetch(queries.sql("eligibility_explain"), [job_id])
    found = await driver.fetch(queries.sql("jobs_get"), job_id)
    full = await _full_caps(driver)
    at_cap = _at_cap(full, found[0]["lane"], found[0]["project"]) if found else []
    return Explanation(
        job_id=job_id, runners=[RunnerVerdict.model_validate(r) for r in rows], at_cap=at_cap
    )


async def never_runnable(driver: Driver, job_id: JobId) -> str | None:
    """The warning a submit gives when no registered runner could ever run `job_id` (a
    capability nobody has, a node no runner is on, more memory than any runner has): it
    would wait with no sign why. None when one could, or when no runner is registered
    yet. The CLI and the HTTP API both say this; a caller that may not read runners gets
    the database's refusal (`FleetqError`), and says nothing."""
    explained = await explain(driver, job_id)
    if not (explained.never and explained.runners):
        return None
    return (
        f"no registered runner could ever run job {job_id} ({explained.summary()}); "
        f"it waits until one that can registers (fleetq explain {job_id})"
    )


async def _full_caps(driver: Driver) -> dict[tuple[str, str], str]:
    """(kind, name) -> "lane checks at its cap (8/8)", for each cap that is full now."""
    return {
        (str(r["kind"]), str(r["name"])): f"{r['kind']} {r['name']} at its cap "
        f"({r['running']}/{r['cap']})"
        for r in await driver.fetch(queries.sql("eligibility_caps"))
        if int(r["running"]) >= int(r["cap"])
    }


def _at_cap(full: dict[tuple[str, str], str], lane: str, project: str) -> list[str]:
    return [text for key in (("lane", lane), ("project", project)) if (text := full.get(key))]


async def explain_many(driver: Driver, jobs: list[Job]) -> dict[JobId, Explanation]:
    """`explain` for many jobs in one statement: the rule is evaluated once per distinct
    shape of requirements among them, and each job gets its shape's verdicts."""
    if not jobs:
        return {}
    rows = await driver.fetch(queries.sql("eligibility_explain"), [j.id for j in jobs])
    by_shape: dict[tuple[object, ...], list[RunnerVerdict]] = defaultdict(list)
    for row in rows:
        by_shape[_shape(row)].append(RunnerVerdict.model_validate(row))
    full = await _full_caps(driver)
    return {
        j.id: Explanation(
            job_id=j.id,
            runners=by_shape.get(_shape(j.model_dump()), []),
            at_cap=_at_cap(full, j.lane, j.project),
        )
        for j in jobs
    }


def _shape(row: Mapping[str, Any]) -> tuple[object, ...]:
    """What the rule reads of a job."""
    return (
        row["lane"],
        tuple(row["capabilities"]),
        row["requested_node"],
        row["memory_mb"],
        row["cpu_millis"],
    )


def _cpus(millis: int) -> str:
    return f"{millis / 1000:g}"
