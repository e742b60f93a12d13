"""Removing what is no longer wanted while keeping its history.

An operation is retired, not deleted: its jobs and results name it and keep their
meaning, a submit is refused, and `fleetq apply` with it in the file brings it back. A
runner is forgotten, not deleted: its executions and events stay, it is no longer listed,
counted as capacity or offered as eligible, and it is back as soon as it is heard from
again. Both refuse while live work depends on them (`RefusedNow`).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from fleetq.core import queries, validation
from fleetq.core.driver import Driver


class Removed(BaseModel):
    """What `config remove operation` did."""

    project: str
    operation: str
    removed: bool  # False: it had been removed before
    retired_at: datetime
    jobs: int  # jobs in its history, which stay


async def remove_operation(driver: Driver, *, project: str, operation: str, actor: str) -> Removed:
    """Retire `project/operation`; refused while it has queued, claimed or running jobs."""
    (row,) = await driver.fetch(
        queries.sql("config_remove_operation"),
        project,
        operation,
        validation.text(actor, "actor"),
    )
    return Removed(project=project, operation=operation, **dict(row))


async def forget_runner(driver: Driver, *, runner: str, actor: str) -> datetime:
    """Forget an offline runner that holds nothing; returns when it was forgotten."""
    (row,) = await driver.fetch(
        queries.sql("runners_forget"), runner, validation.text(actor, "actor")
    )
    return row["forgotten_at"]  # type: ignore[no-any-return]
