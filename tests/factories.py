"""Put rows in any state, directly, so a test starts where it needs to be.

Factories write SQL straight to the tables (they are test fixtures, not the protocol);
the CHECK constraints still apply, so a factory cannot build a state the schema forbids.
"""

from __future__ import annotations

import uuid
from typing import Any

from psycopg.types.json import Jsonb

from fleetq.core.db import SyncConnection

SHA = "0123456789abcdef0123456789abcdef01234567"
LIVE = ("claimed", "running")
TERMINAL = ("succeeded", "failed", "cancelled", "refused")


def lane(conn: SyncConnection, name: str = "checks") -> str:
    """A lane (idempotent)."""
    conn.execute("INSERT INTO fleetq.lanes (name) VALUES ($1) ON CONFLICT DO NOTHING", [name])
    return name


def project(conn: SyncConnection, name: str = "webapp", *, release_gate: bool = False) -> str:
    """A project (idempotent)."""
    conn.execute(
        "INSERT INTO fleetq.projects (name, repository, release_gate) VALUES ($1, $2, $3) "
        "ON CONFLICT DO NOTHING",
        [name, f"/srv/git/{name}.git", release_gate],
    )
    return name


def operation(
    conn: SyncConnection,
    project_name: str = "webapp",
    name: str = "unit",
    *,
    lane_name: str = "checks",
    capabilities: tuple[str, ...] = (),
    memory_mb: int = 0,
    cpu_millis: int = 0,
    timeout_s: int = 600,
) -> tuple[str, str]:
    """An operation, with its project and lane."""
    project(conn, project_name)
    lane(conn, lane_name)
    conn.execute(
        "INSERT INTO fleetq.operations (project, name, lane, command, capabilities, memory_mb, "
        "cpu_millis, timeout_s) VALUES ($1, $2, $3, 'true', $4, $5, $6, $7) "
        "ON CONFLICT DO NOTHING",
        [project_name, name, lane_name, list(capabilities), memory_mb, cpu_millis, timeout_s],
    )
    return project_name, name


def runner(
    conn: SyncConnection,
    node: str = "node-a",
    name: str = "r1",
    *,
    lanes: dict[str, int] | None = None,
    capabilities: tuple[str, ...] = (),
    memory_mb: int = 8192,
    cpu_millis: int = 4000,
    state: str = "active",
) -> str:
    """A runner serving `lanes` (lane -> slots)."""
    runner_id = f"{node}/{name}"
    conn.execute(
        "INSERT INTO fleetq.runners (id, node, name, capabilities, memory_mb, cpu_millis, state) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7)",
        [runner_id, node, name, list(capabilities), memory_mb, cpu_millis, state],
    )
    for lane_name, slots in (lanes or {"checks": 2}).items():
        lane(conn, lane_name)
        conn.execute(
            "INSERT INTO fleetq.runner_lanes (runner_id, lane, slots) VALUES ($1, $2, $3)",
            [runner_id, lane_name, slots],
        )
    return runner_id


def job(
    conn: SyncConnection,
    *,
    op: tuple[str, str] | None = None,
    state: str = "queued",
    owner: str | None = None,
    lease_version: int | None = None,
    priority_class: int = 2,
    commit_sha: str = SHA,
    **columns: Any,
) -> int:
    """A job in any state; a live one gets an owner and a lease that has not expired."""
    project_name, op_name = op or operation(conn)
    row = conn.execute(
        "SELECT lane, capabilities, memory_mb, cpu_millis, timeout_s FROM fleetq.operations "
        "WHERE project = $1 AND name = $2",
        [project_name, op_name],
    ).fetchone()
    assert row is not None, "the operation must exist"
    values: dict[str, Any] = {
        "project": project_name,
        "operation": op_name,
        "commit_sha": commit_sha,
        "lane": row[0],
        "capabilities": row[1],
        "memory_mb": row[2],
        "cpu_millis": row[3],
        "timeout_s": row[4],
        "submitted_by": "tests",
        "priority_class": priority_class,
        "state": state,
    }
    if state in LIVE:
        values["lease_owner"] = owner or runner(conn, name=f"r{uuid.uuid4().hex[:6]}")
        values["lease_version"] = lease_version or 1
        values["claim_id"] = uuid.uuid4()
    if state in TERMINAL:
        values["finished_at"] = "now"
    values.update(columns)
    if "payload" in values:
        values["payload"] = Jsonb(values["payload"])
    names = list(values)
    placeholders = [f"${i}" for i in range(1, len(names) + 1)]
    if state in LIVE and "lease_expires_at" not in values:
        names.append("lease_expires_at")
        placeholders.append("clock_timestamp() + interval '30 seconds'")
    sql = (
        f"INSERT INTO fleetq.jobs ({', '.join(names)}) VALUES ({', '.join(placeholders)}) "
        "RETURNING id"
    )
    found = conn.execute(sql.encode(), [values[n] for n in values]).fetchone()
    assert found is not None
    return int(found[0])
