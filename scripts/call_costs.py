"""What one protocol call costs the server: backend CPU per call, one connection.

    uv run python scripts/call_costs.py [--dsn DSN] [--calls 500] [--batches 1,8,32,256]
                                        [--only-cycles] [--setup FILE.sql]

The throughput benchmark's per-job figures mix what a call costs with how many jobs it
carries. This measures the calls a job makes, one job each, as the steady stream makes
them: a submit, a claim of one job, an outcome of one job (of an in-process handler's
job: its execution is written at the outcome, once), and `SELECT 1` for the floor. Then a
runner's steady state under a backlog for each batch size: outcomes of a batch carrying
the claim of the next (fleetq.complete_and_claim), per call and per job; the cycles run
in order on one database, so a later one also shows what the history left by the
earlier ones costs. Each call's CPU is the server backend's own user+system time
(`/proc/PID/stat`), so the server must run on this machine (the default embedded one
does). Prints one line per call: backend CPU and wall time per call, in ms. Uses a
scratch database, dropped afterwards; `--setup` runs SQL in it first (to try a schema
change: drop an index, say, and compare).
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


def measure(name: str, pid: int, calls: int, call: Callable[[], object], jobs: int = 1) -> None:
    """Run `call` twice to warm the connection's plans, then `calls` times, timed; with
    `jobs` > 1, also per job (each call carrying that many)."""
    call()
    call()
    cpu, wall = backend_cpu_s(pid), time.perf_counter()
    for _ in range(calls):
        call()
    cpu, wall = backend_cpu_s(pid) - cpu, time.perf_counter() - wall
    per_call = f"backend CPU {1000 * cpu / calls:6.3f} ms/call   wall {1000 * wall / calls:6.3f}"
    per_job = f"   CPU {1000 * cpu / calls / jobs:6.3f} ms/job" if jobs > 1 else ""
    print(f"{name:12} {per_call}{per_job}")


def run(conn: SyncConnection, calls: int, batches: list[int], only_cycles: bool) -> None:
    # room for every job the cycles leave held (each leaves its last claim)
    runner = factories.runner(
        conn, lanes={"checks": 100_000}, memory_mb=100_000_000, cpu_millis=100_000_000
    )
    project, operation = factories.operation(conn)
    conn.execute(
        "UPDATE fleetq.operations SET handler = 'bench:noop', command = NULL "
        "WHERE project = $1 AND name = $2",
        [project, operation],
    )
    (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone() or (0,)
    if not Path(f"/proc/{pid}").exists():
        raise SystemExit("the server's backend is not on this machine: no CPU to read")
    if not only_cycles:
        single_calls(conn, pid, runner, project, operation, calls)
    for batch in batches:
        cycle(conn, pid, runner, project, operation, batch, max(20, 20 * calls // batch))


def single_calls(
    conn: SyncConnection, pid: int, runner: str, project: str, operation: str, calls: int
) -> None:
    """The calls one job of the steady stream makes, one job each, and the floor."""
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


def cycle(
    conn: SyncConnection,
    pid: int,
    runner: str,
    project: str,
    operation: str,
    batch: int,
    calls: int,
) -> None:
    """A runner's steady state under a backlog: outcomes of `batch` jobs carrying the claim
    of the next `batch` (fleetq.complete_and_claim), per call and per job."""
    # the runner has no heartbeat loop here: alive as of now (offline after 30 s)
    conn.execute(
        "UPDATE fleetq.runners SET last_heartbeat_at = clock_timestamp() WHERE id = $1", [runner]
    )
    backlog = batch * (calls + 3)
    n = [None] * backlog
    conn.execute(
        queries.sql("jobs_submit_many"),
        [
            [project] * backlog,
            [operation] * backlog,
            [factories.SHA] * backlog,
            n,
            n,
            n,
            ["{}"] * backlog,
            n,
            "bench",
        ],
    ).fetchall()
    rows = conn.execute(queries.sql("lease_claim"), [runner, "checks", batch, uuid.uuid4()])
    held = [(r[0], r[1]) for r in rows.fetchall()]
    statement = queries.sql("lease_complete_and_claim")

    def one() -> None:
        ids, tokens = [h[0] for h in held], [h[1] for h in held]
        k, none = len(ids), [None] * len(ids)
        rows = conn.execute(
            statement,
            [
                runner,
                ids,
                tokens,
                ["succeeded"] * k,
                [0] * k,
                none,
                [""] * k,
                none,
                none,
                none,
                "checks",
                batch,
                uuid.uuid4(),
            ],
        ).fetchall()
        held[:] = [(r[1], r[3]) for r in rows if r[0] == "claim"]
        if len(held) != batch:  # the cycle would measure less than it says
            raise SystemExit(f"cycle {batch}: a claim took {len(held)} jobs")

    measure(f"cycle {batch}", pid, calls, one, jobs=batch)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="server to use (default: $FLEETQ_DSN, else embedded)")
    parser.add_argument("--calls", type=int, default=500, help="calls of each kind")
    parser.add_argument(
        "--batches",
        type=lambda v: [int(b) for b in v.split(",")],
        default=[1, 8, 32, 256],
        help="outcome+claim batch sizes to cycle (comma-separated; default 1,8,32,256)",
    )
    parser.add_argument(
        "--setup", type=Path, help="SQL file run in the scratch database first (experiments)"
    )
    parser.add_argument("--only-cycles", action="store_true", help="measure the cycles alone")
    args = parser.parse_args()
    server = resolve_dsn(args.dsn)
    with (
        migrate.scratch_database(server, "fleetq_call_costs") as dsn,
        connect(dsn, autocommit=True) as conn,
    ):
        if args.setup:
            conn.execute(args.setup.read_text())
        run(conn, args.calls, args.batches, args.only_cycles)
    return 0


if __name__ == "__main__":
    sys.exit(main())
