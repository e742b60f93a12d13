"""What one protocol call costs the server: backend CPU per call, one connection.

    uv run python scripts/call_costs.py [--dsn DSN] [--calls 500] [--batches 1,8,32,256]
                                        [--only-cycles] [--setup FILE.sql]
                                        [--against FILE.sql [--rounds 10]]

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

`--against FILE.sql` compares instead of measuring: only the cycles, on two scratch
databases side by side, A as `--setup` leaves it and B with FILE.sql run too, their calls
alternating in blocks (A B B A ...) so that the machine's drift, which on a shared
machine is tens of percent within minutes, falls on both alike. Prints each side's CPU
per job and B/A. To compare this tree with an older revision's protocol:

    for f in migrations/protocol/*.sql; do git show REV:$f; done > old.sql
    uv run python scripts/call_costs.py --against old.sql    # B/A > 1: REV cost more

(the revisions' numbered migrations must agree: only the protocol files are swapped).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
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
    s = prepare(conn, "A")
    if not only_cycles:
        single_calls(conn, s.pid, s.runner, s.project, s.operation, calls)
    for batch in batches:
        cycle(conn, s.pid, s.runner, s.project, s.operation, batch, max(20, 20 * calls // batch))


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
            [
                runner,
                [job],
                [token],
                ["succeeded"],
                [0],
                [None],
                [""],
                [None],
                [None],
                [None],
                [None],
            ],
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
    one = cycle_call(conn, runner, project, operation, batch, calls)
    measure(f"cycle {batch}", pid, calls, one, jobs=batch)


# How often a cycle renews its runner's heartbeat: a runner silent for 30 s is offline and
# its claims take nothing; one UPDATE per this many calls is lost in their cost.
BEAT_EVERY = 2_000


def beat(conn: SyncConnection, runner: str) -> None:
    """The runner has no heartbeat loop here: alive as of now (offline after 30 s)."""
    conn.execute(
        "UPDATE fleetq.runners SET last_heartbeat_at = clock_timestamp() WHERE id = $1", [runner]
    )


def cycle_call(
    conn: SyncConnection, runner: str, project: str, operation: str, batch: int, calls: int
) -> Callable[[], None]:
    """A backlog for `calls` cycles of `batch` (and a few more), the first claim made; the
    call that settles the held batch and claims the next."""
    beat(conn, runner)
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
    calls_made = itertools.count(1)

    def one() -> None:
        if next(calls_made) % BEAT_EVERY == 0:
            beat(conn, runner)  # a long cycle outlives the runner's offline_after (30 s)
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
                none,
            ],
        ).fetchall()
        held[:] = [(r[1], r[3]) for r in rows if r[0] == "claim"]
        if len(held) != batch:  # the cycle would measure less than it says
            raise SystemExit(f"cycle {batch}: a claim took {len(held)} jobs")

    return one


@dataclass
class Side:
    """One scratch database of a paired comparison, ready to cycle."""

    name: str
    conn: SyncConnection
    pid: int
    runner: str
    project: str
    operation: str
    cpu_s: float = 0.0


def paired(sides: list[Side], calls: int, batches: list[int], rounds: int) -> None:
    """Each cycle on both sides, in `rounds` blocks each, alternating A B B A ..."""
    for batch in batches:
        block = max(1, max(20, 20 * calls // batch) // rounds)  # as many calls as `run`'s
        ones = [
            cycle_call(s.conn, s.runner, s.project, s.operation, batch, block * rounds)
            for s in sides
        ]
        for s, one in zip(sides, ones, strict=True):
            s.cpu_s = 0.0
            one()
            one()
        for r in range(rounds):
            order = [0, 1] if r % 2 == 0 else [1, 0]
            for i in order:
                s, one = sides[i], ones[i]
                beat(s.conn, s.runner)  # outside the measured calls
                cpu = backend_cpu_s(s.pid)
                for _ in range(block):
                    one()
                s.cpu_s += backend_cpu_s(s.pid) - cpu
        per_job = [1000 * s.cpu_s / (block * rounds) / batch for s in sides]
        print(
            f"cycle {batch:<6} A {per_job[0]:6.3f} ms/job   B {per_job[1]:6.3f} ms/job   "
            f"B/A {per_job[1] / per_job[0]:5.3f}   ({rounds} blocks of {block} calls each)"
        )


def prepare(conn: SyncConnection, name: str) -> Side:
    """A runner with room for every job the cycles leave held, and a no-op handler."""
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
    return Side(name, conn, pid, runner, project, operation)


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
    parser.add_argument(
        "--against",
        type=Path,
        help="compare: cycles on two databases, B with this SQL file run too (see above)",
    )
    parser.add_argument(
        "--rounds", type=int, default=10, help="with --against: blocks per side and cycle"
    )
    args = parser.parse_args()
    server = resolve_dsn(args.dsn)
    with contextlib.ExitStack() as stack:
        sides = []
        for name in ["A", "B"] if args.against else ["A"]:
            dsn = stack.enter_context(migrate.scratch_database(server, f"fleetq_call_costs_{name}"))
            conn = stack.enter_context(connect(dsn, autocommit=True))
            if args.setup:
                conn.execute(args.setup.read_text())
            if name == "B":
                conn.execute(args.against.read_text())
            sides.append(conn)
        if not args.against:
            run(sides[0], args.calls, args.batches, args.only_cycles)
            return 0
        pairs = [prepare(conn, name) for conn, name in zip(sides, "AB", strict=True)]
        paired(pairs, args.calls, args.batches, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
