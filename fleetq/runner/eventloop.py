"""The event loop a runner serves on: uvloop's where it can, asyncio's otherwise.

Why uvloop: a runner's own work per job is event-loop work (a task, a handful of
futures and callbacks, its share of a socket's reads and writes), and libuv's loop does
it for less. `fleetq bench`, interleaved runs on one machine (docs/performance.md): at
32 slots the runners' CPU per job was 0.12-0.16 ms on uvloop against 0.15-0.18 on
asyncio (medians 0.144 / 0.166), in the 200 jobs/s stream 14% less; at 8 slots no
difference showed. pgqueuer's worker runs on it by default too.

Why not always: uvloop's subprocess_exec takes no `user`, `group` or `extra_groups`,
which `--job-user` needs, so such a runner serves on asyncio's loop; and uvloop is not
built for Windows.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Coroutine
from typing import Any, Literal

from fleetq.core.errors import ConfigError
from fleetq.runner.config import RunnerConfig

LoopKind = Literal["asyncio", "uvloop"]


def available() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def choose(config: RunnerConfig) -> LoopKind:
    """`loop = "auto"`: uvloop unless a job user is set or uvloop is not installed."""
    if config.loop == "uvloop":
        if not available():
            raise ConfigError("loop = uvloop, but uvloop is not installed (pip install uvloop)")
        return "uvloop"
    if config.loop == "asyncio" or config.job_user is not None or not available():
        return "asyncio"
    return "uvloop"


def run(kind: LoopKind, main: Coroutine[Any, Any, int]) -> int:
    """Run `main` to completion on a new loop of `kind`."""
    if kind == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def running() -> LoopKind:
    """The kind of the loop this is called from (for the runner's `serving` line)."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.split(".")[0] == "uvloop" else "asyncio"
