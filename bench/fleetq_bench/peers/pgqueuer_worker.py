"""One pgqueuer worker process of `fleetq-bench` (run as `python -m` this module).

It runs `QueueManager.run` as `pgq run` would (under uvloop, as pgqueuer's command line
does), with the row's batch size and in-flight cap, until SIGTERM. Once its listener
answers a health probe it writes its ready file, so the harness starts the clock on
workers that already wait for notifications.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from datetime import timedelta
from pathlib import Path

import asyncpg
import uvloop
from pgqueuer.db import AsyncpgDriver
from pgqueuer.errors import FailingListenerError
from pgqueuer.models import Job
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries

from fleetq.core.db import as_uri
from fleetq_bench.samples import SampleFile

READY_TIMEOUT_S = 60.0


def main() -> None:
    """Parse the options and work until SIGTERM."""
    p = argparse.ArgumentParser(prog="pgqueuer_worker")
    p.add_argument("--dsn", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--cap", type=int, required=True, help="max_concurrent_tasks (0: unset)")
    p.add_argument("--samples", type=Path, required=True)
    p.add_argument("--ready", type=Path, required=True)
    uvloop.run(_work(p.parse_args()))


async def _work(args: argparse.Namespace) -> None:
    conn = await asyncpg.connect(as_uri(args.dsn))
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    samples = SampleFile(args.samples)

    async def noop(job: Job) -> None:
        """Nothing: the queue is what is measured."""

    async def stamp(job: Job) -> None:
        t1 = time.time()  # the handler's first line
        samples.write(float(json.loads(job.payload or b"{}")["t0"]), t1)

    # registered by call, not as decorators: without the peer installed mypy sees Any here
    qm.entrypoint("noop")(noop)
    qm.entrypoint("stamp")(stamp)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, qm.shutdown.set)
    run = asyncio.create_task(qm.run(batch_size=args.batch, max_concurrent_tasks=args.cap or None))
    try:
        await _until_listening(qm, run)
        args.ready.touch()
        await run
    finally:
        samples.close()
        await conn.close()


async def _until_listening(qm: QueueManager, run: asyncio.Task[None]) -> None:
    """Probe the listener until it answers (a probe sent before it listens is lost)."""
    end = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < end and not run.done():
        try:
            await qm.listener_healthy(timeout=timedelta(seconds=0.5))
            return
        except FailingListenerError:
            continue
    if run.done():
        await run  # raise what stopped it
    raise TimeoutError("the pgqueuer listener never answered")


if __name__ == "__main__":
    main()
