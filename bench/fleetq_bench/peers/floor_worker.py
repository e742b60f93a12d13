"""One worker process of the floor (`fleetq_bench.peers.floor`), run as `python -m`.

A claim loop woken by a NOTIFY on the worker's own channel (a submit wakes one worker,
as fleetq's names one runner; a poll every half second, as `fleetq-bench` runs fleetq's
runners, finds what another worker left) takes up to the batch, as far as the in-flight
cap leaves room; each job runs as a task; one writer records the ends of whatever jobs
finished meanwhile in one statement, and only then is their room free again (as a
fleetq runner's slot frees when its outcome commits); a worker that was full looks
again then. Three connections: LISTEN, claims, ends. Until SIGTERM; a job or loop that
fails stops the worker, saying why.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import time
from pathlib import Path

import asyncpg

from fleetq.core.db import as_uri
from fleetq_bench.counters import SQL
from fleetq_bench.samples import SampleFile

POLL_S = 0.5


def main() -> None:
    """Parse the options and work until SIGTERM."""
    p = argparse.ArgumentParser(prog="floor_worker")
    p.add_argument("--dsn", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--cap", type=int, required=True, help="jobs in flight at most")
    p.add_argument("--channel", required=True, help="the channel this worker LISTENs on")
    p.add_argument("--samples", type=Path, required=True)
    p.add_argument("--ready", type=Path, required=True)
    asyncio.run(Worker(p.parse_args()).run())


class Worker:
    """The claim loop, the jobs and the writer of their ends."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.samples = SampleFile(args.samples)
        self.wake = asyncio.Event()
        self.stop = asyncio.Event()
        self.finished = asyncio.Event()
        self.in_flight = 0
        self.ended: list[int] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.failed: BaseException | None = None

    async def run(self) -> None:
        dsn = as_uri(self.args.dsn)
        listener, claims, ends = [await asyncpg.connect(dsn) for _ in range(3)]
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        try:
            await listener.add_listener(self.args.channel, lambda *_: self.wake.set())
            self.args.ready.touch()
            loops = [asyncio.create_task(self._claim(claims)), asyncio.create_task(self._end(ends))]
            stop = asyncio.create_task(self.stop.wait())
            await asyncio.wait([stop, *loops], return_when=asyncio.FIRST_COMPLETED)
            for task in (stop, *loops):
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            if self.failed is not None:
                raise self.failed
            for task in loops:  # a loop that ended by itself failed: say why, loudly
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            self.samples.close()
            for conn in (listener, claims, ends):
                await conn.close()

    async def _claim(self, conn: asyncpg.Connection) -> None:
        while True:
            self.wake.clear()  # before claiming: a NOTIFY meanwhile is not lost
            limit = min(self.args.batch, self.args.cap - self.in_flight)
            if limit > 0:
                rows = await conn.fetch(SQL.sql("floor_claim"), limit)
                self.in_flight += len(rows)
                for row in rows:
                    task = asyncio.create_task(self._job(row["id"], row["payload"]))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                if len(rows) == limit:
                    continue  # there may be more right behind
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), POLL_S)

    async def _job(self, job_id: int, payload: str | None) -> None:
        try:
            if payload is not None:  # a latency job: stamp its first line
                t1 = time.time()
                self.samples.write(float(json.loads(payload)["t0"]), t1)
        except Exception as exc:  # a benchmark's job must not fail: stop, saying why
            self.failed = exc
            self.stop.set()
        finally:
            self.ended.append(job_id)
            self.finished.set()

    async def _end(self, conn: asyncpg.Connection) -> None:
        while True:
            await self.finished.wait()
            self.finished.clear()
            ended, self.ended = self.ended, []
            await conn.execute(SQL.sql("floor_done"), ended)
            full = self.in_flight >= self.args.cap
            self.in_flight -= len(ended)
            if full:
                self.wake.set()  # room again: look for what waited for it


if __name__ == "__main__":
    main()
