"""What one protocol call costs the server: backend CPU per call, one connection.

    uv run python scripts/call_costs.py [--dsn DSN] [--calls 500]

The throughput benchmark's per-job figures mix what a call costs with how many jobs it
carries. This measures the calls a job makes, one job each, as the steady stream makes
them: a submit, a claim of one job, an outcome of one job (of an in-process handler's
job: its execution is recorded at the claim), and `SELECT 1` for the floor. Each call's
CPU is the server backend's own user+system time (`/proc/PID/stat`), so the server must
run on this machine (the default embedded one does). Prints one line per call: backend
CPU and wall time per call, in ms. Uses a scratch database, dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleetq.core import migrate, queries  # noqa: E402
from fleetq.core.db import SyncConnection, connect, resolve_dsn  # noqa: E402
from tests import factories  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def backend_cpu_s(pid: int) -> float:
    """User+system seconds of one server process (it must run on this machine)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def measure(name: str, pid: int, calls: int, call: Callable[[], object]) -> None:
    """Run `call` twice to warm the connection's plans, then `calls` times, timed."""
    call()
    call()
    cpu, wall = backend_cpu_s(pid), time.perf_counter()
    for _ in range(calls):
        call()
    cpu, wall = backend_cpu_s(pid) - cpu, time.perf_counter() - wall
    per_call = f"backend CPU {1000 * cpu / calls:6.3f} ms/call   wall {1000 * wall / calls:6.3f}"
    print(f"{name:12} {per_call}")


def run(conn: SyncConnection, calls: int) -> None:
    runner = factories.runner(conn, lanes={"checks": 100_000})
    project, operation = factories.operation(conn)
    conn.execute(
        "UPDATE fleetq.operations SET handler = 'bench:noop', command = NULL "
        "WHERE project = $1 AND name = $2",
        [project, operation],
    )
    (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone() or (0,)
    if not Path(f"/proc/{pid}").exists():
        raise SystemExit("the server's backend is not on this machine: no CPU to read")
    submit, claim = queries.sql("jobs_submit"), queries.sql("lease_claim")
    args = [project, operation, factories.SHA, None, None, None, "bench", None, None, None]
    measure("submit", pid, calls, lambda: conn.execute(submit, args).fetchall())
    claimed: list[tuple[int, int]] = []

    def claim_one() -> None:
        rows = conn.execute(claim, [runner, "checks", 1, uuid.uuid4()]).fetchall()
        claimed.extend((r[0], r[1]) for r in rows)

    measure("claim 1", pid, calls, claim_one)
    outcome, taken = queries.sql("lease_complete"), iter(claimed)

    def complete_one() -> None:
        job, token = next(taken)
        conn.execute(
            outcome,
            [runner, [job], [token], ["succeeded"], [0], [None], [""], [None], [None], [None]],
        ).fetchall()

    measure("outcome 1", pid, calls, complete_one)
    measure("SELECT 1", pid, calls, lambda: conn.execute("SELECT 1").fetchall())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="server to use (default: $FLEETQ_DSN, else embedded)")
    parser.add_argument("--calls", type=int, default=500, help="calls of each kind")
    args = parser.parse_args()
    server = resolve_dsn(args.dsn)
    with (
        migrate.scratch_database(server, "fleetq_call_costs") as dsn,
        connect(dsn, autocommit=True) as conn,
    ):
        run(conn, args.calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
