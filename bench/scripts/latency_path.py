"""Where enqueue -> start goes: each step of the path, timed one spaced call at a time.

    uv run --project bench python bench/scripts/latency_path.py [--dsn DSN] [--rate 20]
        [--calls 200] [--rounds 3]

`fleetq-bench` times the whole path (the producer's clock before the submit to the
handler's first line). This times its parts on an otherwise idle server, each call on
the client's clock, spaced (a call every 1/rate s, default 20: each finds its server
process idle since the last, as a stream's calls do, not a hot loop's warm caches; the
whole run takes about calls x rounds x 7 / rate seconds):

- `SELECT 1`: one round trip;
- a one-row INSERT whose commit waits for its WAL flush, and one that does not
  (`synchronous_commit = off`): the difference is what a durable commit costs;
- the floor's enqueue and claim (`fleetq_bench/sql/floor.sql`): the least a durable
  queue does, one statement each;
- fleetq's submit and claim of one job (what the stream's submit and a runner's claim
  run), the producer and the runner on connections of their own.

Enqueue -> start is at least a submit, a claim, and the wake-up and handler start between
and after them; the floor's pair is that least on this server. The kinds of call take
turns (a block of each per round), so the machine's drift falls on all of them. Prints
p50 and p90 per step, in ms. Uses a scratch database, dropped afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: fleetq's test factories
sys.path.insert(0, str(ROOT))

from fleetq.core import migrate, queries  # noqa: E402
from fleetq.core.db import SyncConnection, connect, resolve_dsn  # noqa: E402
from fleetq_bench.sql import SQL  # noqa: E402
from tests import factories  # noqa: E402

Step = Callable[[], object]


def paced(
    rate: float,
    calls: int,
    steps: dict[str, Step],
    out: dict[str, list[float]],
    between: Callable[[], None],
) -> None:
    """Run each step `calls` times, taking turns, one call every 1/rate s: every call
    finds the server idle since the last. `between` runs before each call, untimed."""
    due = time.monotonic()
    for _ in range(calls):
        for name, step in steps.items():
            due += 1 / rate
            between()
            time.sleep(max(0.0, due - time.monotonic()))  # pacing, not synchronisation
            t0 = time.perf_counter()
            step()
            out.setdefault(name, []).append(1000 * (time.perf_counter() - t0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="server to use (default: $FLEETQ_DSN, else embedded)")
    parser.add_argument("--rate", type=float, default=20.0, help="calls per second")
    parser.add_argument("--calls", type=int, default=200, help="calls of each kind per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (each kind in turn)")
    args = parser.parse_args()
    server = resolve_dsn(args.dsn)
    out: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        dsn = stack.enter_context(migrate.scratch_database(server, "fleetq_latency_path"))
        producer = stack.enter_context(connect(dsn, autocommit=True))
        runner_conn = stack.enter_context(connect(dsn, autocommit=True))
        runner = factories.runner(
            producer, lanes={"checks": 100_000}, memory_mb=100_000_000, cpu_millis=100_000_000
        )
        project, operation = factories.operation(producer)
        producer.execute(SQL.sql("floor_install"))
        producer.execute("CREATE TABLE plain (x integer)")
        lax = stack.enter_context(connect(dsn, autocommit=True))
        lax.execute("SET synchronous_commit = off")
        kinds = _kinds(producer, runner_conn, lax, runner, project, operation)
        beats = stack.enter_context(connect(dsn, autocommit=True))
        alive = Heartbeat(beats, runner)
        for _ in range(args.rounds):
            for steps in kinds:
                paced(args.rate, args.calls, steps, out, alive)
    print(
        f"{'step':28} {'p50 ms':>7} {'p90 ms':>7}   ({args.calls * args.rounds} calls each,"
        f" {args.rate:g}/s)"
    )
    for name, values in out.items():
        values.sort()
        p90 = values[int(0.9 * (len(values) - 1))]
        print(f"{name:28} {statistics.median(values):7.3f} {p90:7.3f}")
    return 0


def _kinds(
    producer: SyncConnection,
    runner_conn: SyncConnection,
    lax: SyncConnection,
    runner: str,
    project: str,
    operation: str,
) -> list[dict[str, Step]]:
    submit, claim = queries.sql("jobs_submit"), queries.sql("lease_claim")
    payload = json.dumps({"t0": 0})

    def fleetq_claim() -> None:
        rows = runner_conn.execute(claim, [runner, "checks", 1, uuid.uuid4()]).fetchall()
        if len(rows) != 1:
            raise SystemExit(f"fleetq's claim took {len(rows)} jobs, not the one submitted")

    def floor_claim() -> None:
        if len(runner_conn.execute(SQL.sql("floor_claim"), [1]).fetchall()) != 1:
            raise SystemExit("the floor's claim took no job")

    args = [project, operation, factories.SHA, None, None, None, "bench", payload, None, None]
    return [
        {"SELECT 1 (a round trip)": lambda: producer.execute("SELECT 1").fetchall()},
        {
            "INSERT, commit flushed": lambda: producer.execute("INSERT INTO plain VALUES (1)"),
            "INSERT, commit not waited": lambda: lax.execute("INSERT INTO plain VALUES (1)"),
        },
        {
            "floor: enqueue": lambda: producer.execute(SQL.sql("floor_submit"), [payload, 1]),
            "floor: claim": floor_claim,
        },
        {
            "fleetq: submit": lambda: producer.execute(submit, args).fetchall(),
            "fleetq: claim": fleetq_claim,
        },
    ]


class Heartbeat:
    """The runner has no heartbeat loop here (it is offline 30 s after its last beat):
    its row renewed every 10 s, on a connection of its own, outside the timed calls."""

    def __init__(self, conn: SyncConnection, runner: str) -> None:
        self.conn, self.runner, self.last = conn, runner, -1e9

    def __call__(self) -> None:
        if time.monotonic() - self.last >= 10:
            self.conn.execute(
                "UPDATE fleetq.runners SET last_heartbeat_at = clock_timestamp() WHERE id = $1",
                [self.runner],
            )
            self.last = time.monotonic()


if __name__ == "__main__":
    sys.exit(main())
