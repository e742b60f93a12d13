"""A small fleet for queue tests: lanes, projects, operations and runners, built through
the same calls production uses (runners register through `fleet.register`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from fleetq.core import fleet, leasing, producer
from fleetq.core.db import SyncConnection, connect
from fleetq.core.driver import Driver
from fleetq.core.models import Claim, Registration, RunnerId, StartReport
from tests import factories

SHA = factories.SHA
OTHER_SHA = "f" * 40


@contextmanager
def wakeups(dsn: str) -> Iterator[list[str]]:
    """The `fleetq_work` wake-ups committed while the block runs: a list, filled when the
    block ends (a NOTIFY is delivered at its commit, read with the next round trip)."""
    heard: list[str] = []
    with connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN fleetq_work")
        yield heard
        listener.execute("SELECT 1")
        heard.extend(n.payload for n in listener.notifies(timeout=0, stop_after=10))


def operations(conn: SyncConnection) -> None:
    """webapp (a release gate) and tools, with a spread of requirements."""
    factories.lane(conn, "checks")
    factories.lane(conn, "control")
    factories.project(conn, "webapp", release_gate=True)
    factories.project(conn, "tools")
    factories.operation(conn, "webapp", "unit", memory_mb=1024, cpu_millis=1000)
    factories.operation(
        conn, "webapp", "browser", capabilities=("browser",), memory_mb=4096, cpu_millis=2000
    )
    factories.operation(conn, "webapp", "notify", lane_name="control")
    factories.operation(conn, "tools", "lint", memory_mb=256, cpu_millis=500)
    conn.execute(
        "INSERT INTO fleetq.identities (name, role) VALUES ('release-bot', 'release-verification')"
    )


async def runner(
    driver: Driver,
    name: str = "r1",
    *,
    node: str = "node-a",
    lanes: dict[str, int] | None = None,
    capabilities: tuple[str, ...] = (),
    memory_mb: int = 16384,
    cpu_millis: int = 8000,
) -> RunnerId:
    """Register a runner (default: 4 checks slots, 1 control slot, plenty of room)."""
    return await fleet.register(
        driver,
        Registration(
            node=node,
            name=name,
            capabilities=list(capabilities),
            memory_mb=memory_mb,
            cpu_millis=cpu_millis,
            lanes=lanes or {"checks": 4, "control": 1},
        ),
    )


def start_report(claim: Claim, node: str = "node-a") -> StartReport:
    """What a runner reports once it launched `claim`'s process (a made-up pid)."""
    return StartReport(
        job_id=claim.job_id,
        lease_version=claim.lease_version,
        node=node,
        run_id=uuid.uuid4(),
        pid=4242,
        process_started_at=datetime.now(UTC),
    )


async def running(
    driver: Driver, runner: RunnerId, n: int = 1, *, started: bool = True
) -> list[Claim]:
    """`n` tools/lint jobs submitted and claimed by `runner` (from the checks lane), each
    reported started unless `started` is false."""
    for _ in range(n):
        await producer.submit(
            driver, project="tools", operation="lint", commit=SHA, submitted_by="alice"
        )
    claims = await leasing.claim(driver, runner=runner, lane="checks", limit=n)
    assert len(claims) == n, claims
    if started:
        for claim in claims:
            await leasing.report_start(driver, runner=runner, start=start_report(claim))
    return claims
