"""How the console holds up with a big fleet: 10,000 jobs and 100 runners by default.

    uv run python scripts/console_bench.py [--dsn DSN] [--jobs N] [--runners N]

Fills a scratch database (rows written directly, as the test factories do), then prints
the time of each read the console makes on a refresh, and of the app itself: start to
first screen, switching to the jobs view, a NOTIFY-driven refresh of that view, and
moving the cursor. The database is dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleetq.console.app import ConsoleApp  # noqa: E402
from fleetq.console.screenful import tick  # noqa: E402
from fleetq.console.source import Source  # noqa: E402
from fleetq.core import migrate  # noqa: E402
from fleetq.core.db import connect, resolve_dsn  # noqa: E402
from fleetq.core.jobpages import JobFilter  # noqa: E402
from fleetq.core.models import JobId  # noqa: E402
from tests import factories  # noqa: E402
from tests.console.conftest import SIZE, settled, show, until  # noqa: E402

FILL = """
INSERT INTO fleetq.jobs (project, operation, commit_sha, lane, capabilities, memory_mb,
                         cpu_millis, timeout_s, submitted_by, priority_class, state,
                         lease_owner, reserved_on, lease_version, lease_expires_at,
                         created_at, claimed_at, finished_at)
SELECT o.project, o.name, $1, o.lane, o.capabilities, o.memory_mb, o.cpu_millis, o.timeout_s,
       'bench', (g % 3)::smallint, s.state,
       CASE WHEN s.state = 'running' THEN 'node-' || (g % $3) || '/r' END,
       CASE WHEN s.state = 'running' THEN 'node-' || (g % $3) || '/r' END,
       CASE WHEN s.state = 'queued' THEN 0 ELSE 1 END,
       CASE WHEN s.state = 'running' THEN clock_timestamp() + interval '30 s' END,
       clock_timestamp() - make_interval(secs => g % 3600),
       CASE WHEN s.state <> 'queued' THEN clock_timestamp() - make_interval(secs => g % 1800) END,
       CASE WHEN s.state = 'succeeded' THEN clock_timestamp() - make_interval(secs => g % 1700) END
FROM generate_series(1, $2::integer) g
JOIN fleetq.operations o ON o.name = (ARRAY['unit', 'browser', 'lint'])[1 + g % 3]
CROSS JOIN LATERAL (SELECT CASE WHEN g % 10 < 7 THEN 'queued'
                                WHEN g % 10 < 8 THEN 'running'
                                ELSE 'succeeded' END AS state) s
"""


def fill(dsn: str, jobs: int, runners: int) -> None:
    """Runners node-0/r … and `jobs` jobs: 70% queued, 10% running, 20% succeeded."""
    with connect(dsn, autocommit=True) as conn:
        factories.operation(conn, "webapp", "unit", memory_mb=1024, cpu_millis=1000)
        factories.operation(
            conn, "webapp", "browser", capabilities=("browser",), memory_mb=4096, cpu_millis=2000
        )
        factories.operation(conn, "tools", "lint", memory_mb=256, cpu_millis=500)
        for n in range(runners):
            caps = ("browser",) if n % 4 == 0 else ()
            factories.runner(
                conn,
                f"node-{n}",
                "r",
                lanes={"checks": 64},
                capabilities=caps,
                memory_mb=10**6,
                cpu_millis=10**6,
            )
        conn.execute(FILL.encode(), [factories.SHA, jobs, runners])
        conn.execute(
            "INSERT INTO fleetq.events (kind, job_id, runner_id, lease_version) "
            "SELECT 'claimed', id, lease_owner, 1 FROM fleetq.jobs WHERE state = 'running'"
        )
        # a full week of queue history (what the reaper keeps), so its read is timed at
        # its largest
        conn.execute(
            "INSERT INTO fleetq.queue_samples (at, lane, priority_class, queued, claimed) "
            "SELECT date_trunc('minute', clock_timestamp()) - make_interval(mins => m), "
            "'checks', c, m % 50, m % 7 FROM generate_series(0, 7 * 24 * 60 - 1) m, "
            "generate_series(0, 2) c"
        )
        conn.execute("ANALYZE")


async def timed(label: str, work: Callable[[], Awaitable[object]], runs: int = 15) -> None:
    """Print the median and worst of `runs` calls."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        await work()
        times.append((time.perf_counter() - start) * 1000)
    print(f"  {label:40} median {statistics.median(times):7.1f} ms   max {max(times):7.1f} ms")


async def reads(dsn: str) -> None:
    source = Source(dsn)
    await source.open()
    try:
        at = await source.now()
        running = (await source.page(JobFilter(), at)).jobs[0].id
        print("reads (one refresh = overview + the visible view + new events):")
        await timed("overview (lanes, waits, runners, alerts)", lambda: source.overview(at))
        await timed("jobs page (500 newest, waiting reasons)", lambda: source.page(JobFilter(), at))
        await timed(
            "jobs page, filter state:queued",
            lambda: source.page(JobFilter.model_validate({"state": "queued"}), at),
        )
        await timed("job detail", lambda: source.detail(JobId(running), at))
        await timed("events after an id", lambda: source.events(1, 1000))
    finally:
        await source.close()


async def app(dsn: str) -> None:
    print(f"the app (Pilot, headless, terminal {SIZE[0]}x{SIZE[1]}):")
    console = ConsoleApp(dsn, live=True)
    start = time.perf_counter()
    async with console.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: console.ready, deadline=60)
        print(f"  {'start to first screen':40} {(time.perf_counter() - start) * 1000:7.1f} ms")
        start = time.perf_counter()
        await show(pilot, "3")
        print(f"  {'switch to jobs (500 rows)':40} {(time.perf_counter() - start) * 1000:7.1f} ms")
        refreshes = []
        for _ in range(5):
            before = console.loads
            start = time.perf_counter()
            with connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_notify('fleetq_work', '')")
            await settled(pilot, before)
            refreshes.append((time.perf_counter() - start) * 1000)
        print(
            f"  {'NOTIFY to refreshed jobs view':40} median {statistics.median(refreshes):7.1f} ms"
            f"   (includes the {console.follower.coalesce_s * 1000:.0f} ms coalescing window)"
        )
        start = time.perf_counter()
        for _ in range(50):
            await pilot.press("down")
        per_key = (time.perf_counter() - start) * 1000 / 50
        print(f"  {'cursor down, per key':40} {per_key:7.1f} ms")
        start = time.perf_counter()
        tick(console)  # the 1 s clock tick, timed on its own
        ticked = (time.perf_counter() - start) * 1000
        print(f"  {'1 s tick (visible rows redrawn)':40} {ticked:7.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="server to use (default: $FLEETQ_DSN, else embedded)")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runners", type=int, default=100)
    args = parser.parse_args()
    with migrate.scratch_database(resolve_dsn(args.dsn), "fleetq_console_bench") as dsn:
        start = time.perf_counter()
        fill(dsn, args.jobs, args.runners)
        filled = time.perf_counter() - start
        print(f"{args.jobs} jobs, {args.runners} runners ({filled:.1f} s to fill)")
        asyncio.run(reads(dsn))
        asyncio.run(app(dsn))
    return 0


if __name__ == "__main__":
    sys.exit(main())
