"""Signals a runner answers, and the task dump SIGUSR1 asks for (also logged by a
shutdown whose claim loops are stuck)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

log = logging.getLogger("fleetq.runner.service")


class Signalled(Protocol):
    """What the signals act on: the runner service."""

    def request_shutdown(self) -> None: ...

    def task_labels(self) -> dict[asyncio.Task[Any], str]: ...


def install_signals(service: Signalled, add: Callable[[int, Callable[[], None]], None]) -> None:
    """SIGTERM/SIGINT: graceful shutdown; a second one stops running jobs at once.
    SIGUSR1: log what every task of the runner is waiting on (a runner that seems stuck
    says where); SIGUSR2: the threads' stacks, written even if the event loop is blocked."""
    import faulthandler
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        add(sig, service.request_shutdown)
    add(signal.SIGUSR1, lambda: dump_tasks(labels=service.task_labels()))
    faulthandler.register(signal.SIGUSR2, all_threads=True)


def dump_tasks(
    tasks: Iterable[asyncio.Task[Any]] | None = None,
    labels: Mapping[asyncio.Task[Any], str] | None = None,
) -> None:
    """Log each asyncio task (all of them by default) with the whole chain of awaits it
    is suspended in (a task's own stack shows only its outermost coroutine); `labels`
    names tasks that have no name of their own (a job's: "job:ID")."""
    chosen = list(asyncio.all_tasks() if tasks is None else tasks)
    named = {task: (labels or {}).get(task) or task.get_name() for task in chosen}
    log.warning("%d task(s):", len(chosen))
    for task in sorted(chosen, key=lambda t: named[t]):
        log.warning("task %s waits in:\n  %s", named[task], "\n  ".join(_awaits(task)))


def _awaits(task: asyncio.Task[Any]) -> list[str]:
    found: list[str] = []
    step: Any = task.get_coro()
    while step is not None and len(found) < 40:
        frame = getattr(step, "cr_frame", None) or getattr(step, "gi_frame", None)
        if frame is not None:
            code = frame.f_code
            found.append(f"{code.co_filename}:{frame.f_lineno} {code.co_qualname}")
        elif not hasattr(step, "cr_await"):
            found.append(repr(step)[:200])  # a future, a wrapper: where the chain ends
        step = getattr(step, "cr_await", None) or getattr(step, "gi_yieldfrom", None)
    return found
