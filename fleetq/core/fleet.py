"""The runner registry and the operator's levers (drain, pause, resume).

Operators move runners only through database state: these calls write a row, an event
and a NOTIFY on `fleetq_control`; the runner observes it and acts.
"""

from __future__ import annotations

from fleetq.core import queries, validation
from fleetq.core.driver import Driver
from fleetq.core.models import Registration, Runner, RunnerId, RunnerState


async def register(driver: Driver, registration: Registration) -> RunnerId:
    """Register (or re-register) a runner; its reservations are recomputed from the jobs
    it holds, so a restart heals any drift."""
    lanes = sorted(registration.lanes.items())
    rows = await driver.fetch(
        queries.sql("runners_register"),
        registration.node,
        registration.name,
        sorted(set(registration.capabilities)),
        registration.memory_mb,
        registration.cpu_millis,
        [lane for lane, _ in lanes],
        [slots for _, slots in lanes],
        registration.version,
        registration.pid,
    )
    return RunnerId(str(rows[0]["id"]))


async def set_state(
    driver: Driver, *, runner: str, state: RunnerState, reason: str, actor: str
) -> RunnerState:
    """Drain, pause, resume or take offline; returns the state written (a drain with
    nothing running is at once 'drained')."""
    rows = await driver.fetch(
        queries.sql("runners_set_state"),
        runner,
        state.value,
        reason,
        validation.text(actor, "actor"),
    )
    return RunnerState(rows[0]["state"])


async def runners(driver: Driver) -> list[Runner]:
    """Every runner, with lanes, reservations and whether it is offline."""
    rows = await driver.fetch(queries.sql("runners_list"))
    return [Runner.model_validate(row) for row in rows]
