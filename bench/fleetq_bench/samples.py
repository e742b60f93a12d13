"""Latency samples that peers' workers write to files of their own.

A handler appends `t0 t1` (the producer's clock from the payload, its own at its first
line) to its process's file, one line per job; writing to the database instead would add
a transaction per sample to what the benchmark counts. Producer and workers share this
machine's clock, so `t1 - t0` is enqueue -> start as a user would time it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TextIO

PATTERN = "samples-*.txt"


class SampleFile:
    """The appending end, for a worker process."""

    def __init__(self, path: Path) -> None:
        # line-buffered: a sample is on disk once its line is written, so the harness
        # can read the files while the workers still run
        self._file: TextIO = path.open("a", buffering=1, encoding="ascii")

    def write(self, t0: float, t1: float) -> None:
        """Record a job submitted at `t0` whose handler started at `t1`."""
        self._file.write(f"{t0:.6f} {t1:.6f}\n")

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def read_samples(work: Path, since: float) -> list[float]:
    """Enqueue -> start in ms of every sample in `work` submitted at or after `since`."""
    out: list[float] = []
    for path in sorted(work.glob(PATTERN)):
        for line in path.read_text(encoding="ascii").splitlines():
            t0, t1 = (float(x) for x in line.split())
            if t0 >= since:
                out.append((t1 - t0) * 1000)
    return out


async def ready_files(work: Path) -> int:
    """How many workers wrote their ready file (`ready-<index>`) into `work`."""
    return len(await asyncio.to_thread(lambda: list(work.glob("ready-*"))))
