"""One procrastinate worker process of `fleetq-bench` (run as `python -m` this module).

`App.run_worker_async` with the row's concurrency and LISTEN/NOTIFY on, until SIGTERM
(procrastinate's own signal handlers stop it gracefully).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from procrastinate import App, PsycopgConnector

from fleetq_bench.samples import SampleFile


def main() -> None:
    """Parse the options and work until SIGTERM."""
    p = argparse.ArgumentParser(prog="procrastinate_worker")
    p.add_argument("--dsn", required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--pool", type=int, required=True, help="connections in the app's pool")
    p.add_argument("--samples", type=Path, required=True)
    asyncio.run(_work(p.parse_args()))


async def _work(args: argparse.Namespace) -> None:
    app = App(connector=PsycopgConnector(conninfo=args.dsn, min_size=args.pool, max_size=args.pool))
    samples = SampleFile(args.samples)

    async def noop() -> None:
        """Nothing: the queue is what is measured."""

    async def stamp(t0: float) -> None:
        t1 = time.time()  # the handler's first line
        samples.write(t0, t1)

    # registered by call, not as decorators: without the peer installed mypy sees Any here
    app.task(name="noop")(noop)
    app.task(name="stamp")(stamp)

    try:
        async with app.open_async():
            await app.run_worker_async(concurrency=args.concurrency, listen_notify=True)
    finally:
        samples.close()


if __name__ == "__main__":
    main()
