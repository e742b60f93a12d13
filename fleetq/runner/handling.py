"""A handler job: its `async def` loaded once, awaited inline with its timeout and its
stop request, and run again in place, under the same lease, when its database
connection was cut. Never raises for the handler's failure: what happened is a
`Finished`, as for a command."""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import logging
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from fleetq.core.errors import ConnectionFailed, DatabaseBusy, StaleLease
from fleetq.core.models import Outcome
from fleetq.runner import metrics
from fleetq.runner.context import JobContext
from fleetq.runner.deadlines import deadlines
from fleetq.runner.execution import Execution, Operation, Toolkit
from fleetq.runner.executor import TAIL_BYTES, Finished, ms_since
from fleetq.runner.loops import Backoff, wait_or

log = logging.getLogger("fleetq.runner.execution")

# runs of a handler under one lease when its database connection is cut (see run_handler_job)
HANDLER_RUNS = 3


class Stoppable(Protocol):
    """Something that can be asked to stop, and says so to subscribers."""

    stop: asyncio.Event

    def on_stop(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Call `hook` when a stop is requested; returns an unsubscribe function."""
        ...


async def run_handler(
    handler: Callable[..., Awaitable[object]],
    ctx: object,
    *,
    timeout_s: float,
    stoppable: Stoppable,
) -> Finished:
    """Await an in-process handler to its end, its timeout, or a stop request.

    The handler runs inline in the calling task (no extra task per job: handlers are the
    high-throughput path); a stop request cancels this task and is then absorbed here.
    """
    started = time.monotonic()
    if stoppable.stop.is_set():
        return Finished(None, reason="stopped")
    me = asyncio.current_task()
    assert me is not None
    stopping = False

    def cancel() -> None:
        nonlocal stopping
        stopping = True
        me.cancel()

    unsubscribe = stoppable.on_stop(cancel)
    cancelling = me.cancelling()
    loop = asyncio.get_running_loop()
    due = deadlines(loop)
    armed = due.arm(loop, me, timeout_s)
    try:
        result = await handler(ctx)
    except TimeoutError:  # the handler's own (as asyncio.timeout's was taken)
        return Finished(Outcome.FAILED, reason="timeout", run_ms=ms_since(started))
    except asyncio.CancelledError:
        if armed.fired:  # its cancel is taken back; a timeout if no other is pending
            armed.fired = False
            if me.uncancel() <= cancelling and not stopping:
                return Finished(Outcome.FAILED, reason="timeout", run_ms=ms_since(started))
        if not stopping:
            raise
        me.uncancel()
        return Finished(None, reason="stopped", run_ms=ms_since(started))
    except StaleLease:
        return Finished(None, reason="stale", run_ms=ms_since(started))
    except Exception as exc:
        # fleetq's own calls (ctx.transaction, a driver) say a connection was lost, or a
        # lock was not had in time (nothing committed: the handler runs again in place),
        # this way; the handler's own errors (an OSError of its own included) are failures
        if isinstance(exc, ConnectionFailed):
            return Finished(None, lost=f"database connection lost in the handler: {exc}")
        if isinstance(exc, DatabaseBusy):
            return Finished(None, lost=f"database busy in the handler: {exc}")
        return Finished(
            Outcome.FAILED,
            reason="exception",
            log_tail=traceback.format_exc()[-TAIL_BYTES:],
            run_ms=ms_since(started),
        )
    finally:
        due.disarm(armed)
        if armed.fired:  # the handler outlived its cancel: take it back all the same
            me.uncancel()
        unsubscribe()
    tail = "" if result is None else str(result)[-TAIL_BYTES:]
    return Finished(Outcome.SUCCEEDED, exit_code=0, log_tail=tail, run_ms=ms_since(started))


async def run_handler_job(ex: Execution, kit: Toolkit, op: Operation) -> Finished:
    """Run a handler; one whose database connection was cut runs again in place, under
    the same lease, up to `HANDLER_RUNS` times, before its job is handed back.

    Why: a handler makes several round trips, each on a connection that may be new (and
    then makes more), so on a lossy link a run is cut far more often than a command is.
    Handing the job back at each cut spent the reassignment cap on the network (jobs
    failed `reassignments_exhausted` under 2% drops). Running it again here is what a
    new claim would do, minus the claim: handlers are at-least-once per lease already,
    and effects written with `transaction(finish=True)` commit at most once, because
    the lock on the job's row under this token fails once the outcome is in.
    """
    try:
        fn = _load_handler(op.handler or "")
    except Exception as exc:  # whatever its import raises: the job's to refuse, not ours
        return Finished(Outcome.REFUSED, reason=f"handler {op.handler}: {exc}")
    c = ex.claim
    deadline = time.monotonic() + op.timeout_s
    backoff = Backoff()
    for run in range(1, HANDLER_RUNS + 1):
        ctx = ex.ctx = JobContext(
            claim=c,
            runner=kit.runner,
            pool=kit.pool,
            trace_header=ex.traceparent,
            renewed=ex.renewed,
            provenance=ex.provenance,
        )
        left = deadline - time.monotonic()
        finished = await run_handler(fn, ctx, timeout_s=left, stoppable=ex)
        if finished.lost is None or run == HANDLER_RUNS:
            return finished
        delay = backoff.next()
        if ex.stop.is_set() or time.monotonic() + delay >= deadline:
            return finished
        log.warning(
            "job=%d token=%d: %s; running it again in %.1fs (run %d of %d)",
            c.job_id,
            c.lease_version,
            finished.lost,
            delay,
            run + 1,
            HANDLER_RUNS,
        )
        metrics.HANDLER_RERUNS.inc()
        await wait_or(ex.stop, delay)
    raise AssertionError("unreachable")  # pragma: no cover


@functools.cache
def _load_handler(spec: str) -> Callable[..., Awaitable[Any]]:
    module, _, attr = spec.partition(":")
    fn = getattr(importlib.import_module(module), attr)  # once per spec (cached)
    if not inspect.iscoroutinefunction(fn):
        raise TypeError("a handler is an `async def` taking a JobContext")
    return fn  # type: ignore[no-any-return]
