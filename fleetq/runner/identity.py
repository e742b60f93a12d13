"""One process per runner id, held by the runner's LISTEN connection.

Why: two processes serving one runner id each find the other's leases "held but not
running here" and report healthy jobs lost (a rolling restart that starts the new
process before the old one has exited does this). So a runner takes a lock named after
its id before it registers, and a second process is refused while the first is alive,
naming the session that holds it. The lock is a row of `fleetq.coordination` naming
the holding session (`fleetq.take_runner_id`), not an advisory lock: any login of the
database can take any advisory key, and one that took this runner's kept it from
starting. The lock lives on the dedicated LISTEN connection
(never pooled, so never shared); after that connection is re-established it is taken
again. A session this same process left on the server (a partition the backend
outlived) is recognised by its `application_name`, which carries a per-process token,
and ended; any other holder is a second process.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid

import asyncpg

from fleetq.core import queries
from fleetq.core.errors import DatabaseBusy, FleetqError

log = logging.getLogger(__name__)


class RunnerIdInUse(FleetqError):
    """Another process already serves this runner id."""


def application_name(token: str | None = None) -> str:
    """The LISTEN session's name: fleetq's, with this process's token."""
    return f"fleetq-runner-listen {token or new_token()}"


def new_token() -> str:
    return uuid.uuid4().hex[:12]


def pool_application_name(runner: str, token: str) -> str:
    """The name of the runner's pooled sessions: its id (hashed: application_name holds
    63 bytes) and this process's token, so a later process of the same runner can tell
    what an earlier one left behind."""
    return f"fleetq-runner {_runner_hash(runner)} {token}"


def _runner_hash(runner: str) -> str:
    return hashlib.sha256(runner.encode()).hexdigest()[:12]


async def end_predecessors(conn: asyncpg.Connection, runner: str, own_pool: str) -> int:
    """End the pooled sessions an earlier process of this runner left on the server.

    Called once this process holds the runner id (so no other live process serves it).
    A process killed mid-transaction can leave its backend behind, still holding row
    locks (the server notices a vanished client only when it next writes to it, or after
    TCP keepalive): a restarted runner's collection pass then waited on its own
    predecessor's lock. Returns how many sessions were ended."""
    rows = await conn.fetch(
        queries.sql("runners_end_predecessors"), f"fleetq-runner {_runner_hash(runner)} %", own_pool
    )
    if rows:
        log.warning(
            "ended %d database session(s) an earlier process of this runner left (pids %s)",
            len(rows),
            ", ".join(str(r["pid"]) for r in rows),
        )
    return len(rows)


async def take(conn: asyncpg.Connection, runner: str, own_application: str) -> None:
    """Take the runner id's lock on `conn`, or raise `RunnerIdInUse`."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        holder = await conn.fetchrow(queries.sql("runners_take_identity"), runner)
        if holder is None or holder["taken"]:
            return
        if holder["application_name"] == own_application:
            log.warning(
                "ending this runner's own earlier database session (pid %d) that still "
                "holds its runner id",
                holder["pid"],
            )
            await conn.fetchval(queries.sql("runners_end_session"), holder["pid"])
            await _gone(conn, holder["pid"], deadline)
            continue
        if holder["pid"] is None:
            raise RunnerIdInUse(
                f"runner {runner} is already served by another process through the API "
                f"({holder['application_name']}, via login {holder['login']}); stop that "
                "process first, or give this one another --name (its hold runs out within "
                "half a minute of its last renewal)"
            )
        raise RunnerIdInUse(
            f"runner {runner} is already served by another process (its database session: "
            f"pid {holder['pid']}, login {holder['login']}); stop that process first, or "
            "give this one "
            "another --name (a process on a node that died frees it within half a minute)"
        )
    raise DatabaseBusy(f"could not take runner id {runner}: its lock keeps changing hands")


async def _gone(conn: asyncpg.Connection, pid: int, deadline: float) -> None:
    """Wait (until `deadline`) for an ended session's backend to exit: its row names it
    holder until then."""
    while time.monotonic() < deadline:
        if not await conn.fetchval(queries.sql("runners_session_alive"), pid):
            return
        await asyncio.sleep(0.05)
