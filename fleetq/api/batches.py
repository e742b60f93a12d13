"""Many runners' routine calls in one transaction: what an idle fleet costs the database.

A runner's periodic calls (the heartbeat and the state read with it, the renewal of its
hold, the collection's reads, the reaper's and the schedules' looks, a wake-up poll's
token check) need no answer within milliseconds, and one transaction each is what made
an idle fleet cost the database a transaction per runner and second. The gateway holds
them for up to `window_s` from the first and runs them together, in one transaction on
one connection; each call acts for its own token (`tokens_act_for` before it), so every
protocol function decides exactly as it would for that call alone, and a token that is
not a runner's is refused on its own without touching the others.

One rule for failure: a call that fails in a batch (a revoked token, an argument the
server cannot take, its own timeout, a lock it would wait for: a batch waits 0.5 s for a
lock at most) rolls the batch back whole, and each of its calls is run alone, so each
gets the answer it would have got alone and nothing of the others is lost; the token
whose call failed is not batched for a minute, so it cannot make every batch run twice.
Only a token this process has seen answered lately is batched at all: a first call, or a
token nobody knows, runs alone. The database out of reach (no connection, no commit) fails
them all at once: running each alone could only fail again. A call's answer is sent after
the batch commits, so an ambiguous reply is the same as alone: the runner retries and the
protocol says "already".

Calls of the shared passes (the reaper's, the next retry's) that name no runner run once
per batch, whatever their arguments; the others in that batch get what a runner that was
not the leader gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fleetq.api.models import Caller
from fleetq.core import errors, queries
from fleetq.core.driver import AsyncpgDriver, mapped_errors

WINDOW_S = 1.0  # a batch waits this long after its first call at most
MAX_CALLS = 500  # and goes at once when this many wait

# the routine calls batched; everything else (claims, start reports, outcomes, stop
# confirmations, reconciliation's reads) runs at once, in its own transaction
BATCHED = frozenset(
    {
        "lease_heartbeat",
        "runners_get_state",
        "runners_hold_identity",
        "runners_lease_seconds",
        "lease_open_executions",
        "lease_held_by",
        "lease_reap",
        "lease_next_retry_in",
        "schedules_of_lanes",
        "views_now",
    }
)
# calls naming no runner, run once a batch: what the others get instead
_NOT_LEADER: list[dict[str, Any]] = [{"requeued": 0, "failed": 0, "leader": False}]
SHARED: dict[str, Callable[[list[dict[str, Any]]], list[dict[str, Any]]]] = {
    "lease_reap": lambda _rows: _NOT_LEADER,
    "lease_next_retry_in": lambda rows: rows,
    "views_now": lambda rows: rows,
}

# a call whose arguments are larger than this runs alone: one token's heartbeat naming a
# million jobs would otherwise hold every other runner's batch for as long as it takes
MAX_ARGS_BYTES = 64 * 1024

CHECK_ONLY = ""  # a call's name when only its token is checked (a wake-up poll)
# a wake-up poll whose token answered a call this recently is not checked again: it would
# wait for a batch before it could pass on a notice, and it answers hints only (lane
# names, job numbers); a revoked token hears those for this long at most
CHECKED_S = 60.0
_CHECKED_MAX = 100_000  # tokens remembered at most (forgotten all at once beyond)
SET_ASIDE_S = 60.0  # a token whose call failed in a batch runs alone this long
LOCK_WAIT = "500ms"  # a batch's lock_timeout: a call that would wait longer runs alone
MIN_TIMEOUT_S = 1.0  # a batched statement's timeout at least (a caller's own is for it)

log = logging.getLogger("fleetq.api")

Run = Callable[[AsyncpgDriver, str, list[Any], float], Awaitable[list[dict[str, Any]]]]
Alone = Callable[[str, str, list[Any], float], Awaitable[tuple[Caller, list[dict[str, Any]]]]]


class _CallFailed(Exception):
    """A call's own statement failed: the batch is rolled back and each call runs alone."""


@dataclass
class _Call:
    token: str
    name: str
    args: list[Any]
    timeout_s: float
    answer: asyncio.Future[tuple[Caller, list[dict[str, Any]]]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


def not_a_runner(caller: Caller) -> errors.PermissionDenied:
    return errors.PermissionDenied(
        f"the API token of {caller.identity} (a {caller.kind} token) is not a runner's: the "
        "runner endpoints serve runner tokens only"
    )


class Batches:
    """The process's batches of runner calls: `call` waits for its batch's answer."""

    def __init__(
        self,
        connection: Callable[[], contextlib.AbstractAsyncContextManager[AsyncpgDriver]],
        run: Run,
        alone: Alone,
        *,
        window_s: float = WINDOW_S,
        max_calls: int = MAX_CALLS,
    ) -> None:
        self.connection, self.run, self.alone = connection, run, alone
        self.window_s, self.max_calls = window_s, max_calls
        self.pending: list[_Call] = []
        self.arrived = asyncio.Event()
        self.full = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.batches = 0  # counted for tests and the benchmark
        self.calls = 0
        self.run_alone = 0  # calls of failed batches, run alone
        self.checked: dict[bytes, tuple[Caller, float]] = {}  # token digest: who, when
        self.set_aside: dict[bytes, float] = {}  # token digest: until when it runs alone
        self.settling: list[_Call] = []  # the batch in flight
        self.closed = False

    def recently_checked(self, token: str) -> Caller | None:
        """Who `token` stands for, if a call of it was answered within CHECKED_S (and
        none of its calls failed in a batch within SET_ASIDE_S)."""
        key = _digest(token)
        seen = self.checked.get(key)
        now = time.monotonic()
        if seen is None or now - seen[1] > CHECKED_S or self.set_aside.get(key, 0) > now:
            return None
        return seen[0]

    def batchable(self, token: str, name: str, args: list[Any]) -> bool:
        """Whether this call waits for a batch: a routine one, of a routine size, of a
        token answered lately (`batched`, `recently_checked`)."""
        return batched(name, args) and self.recently_checked(token) is not None

    def _checked(self, token: str, caller: Caller) -> None:
        if len(self.checked) >= _CHECKED_MAX:
            self.checked.clear()
        self.checked[_digest(token)] = (caller, time.monotonic())

    async def call(
        self, token: str, name: str, args: list[Any], timeout_s: float
    ) -> tuple[Caller, list[dict[str, Any]]]:
        """The rows of `name` for the runner of `token`, and who that is."""
        if self.closed:
            raise errors.ConnectionFailed("the API is shutting down")
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._flush_forever(), name="runner call batches")
        entry = _Call(token, name, args, timeout_s)
        self.pending.append(entry)
        self.arrived.set()
        if len(self.pending) >= self.max_calls:
            self.full.set()
        caller, rows = await entry.answer
        self._checked(token, caller)
        return caller, rows

    async def at_once(
        self, token: str, name: str, args: list[Any], timeout_s: float
    ) -> tuple[Caller, list[dict[str, Any]]]:
        """`name` for the runner of `token` in a transaction of its own, now."""
        caller, rows = await self.alone(token, name, args, timeout_s)
        self._checked(token, caller)
        return caller, rows

    async def close(self) -> None:
        """Stop batching; every call not answered yet is told the API is going away."""
        self.closed = True
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        for entry in [*self.settling, *self.pending]:
            _give(entry, errors.ConnectionFailed("the API is shutting down"))

    async def _flush_forever(self) -> None:
        while True:
            await self.arrived.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.full.wait(), self.window_s)
            batch, self.pending = self.pending[: self.max_calls], self.pending[self.max_calls :]
            if not self.pending:
                self.arrived.clear()
            if len(self.pending) < self.max_calls:
                self.full.clear()
            batch = [e for e in batch if not e.answer.done()]  # whose client is still there
            if not batch:
                continue
            self.settling = batch
            try:
                await self._settle(batch)
            except Exception:  # a bug here must not leave runners waiting for ever
                log.exception("a batch of %d runner calls failed", len(batch))
                for entry in batch:
                    _give(entry, errors.FleetqError("the batch failed"))
            finally:
                self.settling = []

    async def _settle(self, batch: list[_Call]) -> None:
        self.batches += 1
        self.calls += len(batch)
        started = time.perf_counter()
        try:
            answers = await self._together(batch)
        except (errors.ConnectionFailed, errors.DatabaseBusy) as exc:
            # no connection, or no commit: alone, each could only fail the same way
            for entry in batch:
                _give(entry, exc)
            return
        except Exception as exc:  # a call's own failure (_CallFailed), or the token check's
            cause = exc.__cause__ if isinstance(exc, _CallFailed) else exc
            log.debug("a batch of %d runner calls failed (%s); each runs alone", len(batch), cause)
            self.run_alone += len(batch)
            await asyncio.gather(*(self._alone(entry) for entry in batch))
            return
        for entry, answer in zip(batch, answers, strict=True):
            _give(entry, answer)
        log.debug(
            "%d runner calls in one transaction, %.1f ms",
            len(batch),
            (time.perf_counter() - started) * 1000,
        )

    async def _together(
        self, batch: list[_Call]
    ) -> list[tuple[Caller, list[dict[str, Any]]] | BaseException]:
        """Every call of `batch` in one transaction: its answers once it has committed."""
        answers: list[tuple[Caller, list[dict[str, Any]]] | BaseException] = []
        shared: dict[str, list[dict[str, Any]]] = {}
        with mapped_errors():
            async with self.connection() as driver:
                await driver.fetch(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
                for entry in batch:
                    try:
                        answers.append(await self._one(driver, entry, shared))
                    except Exception as exc:
                        raise _CallFailed from exc  # out of the transaction: rolled back
        return answers

    async def _one(
        self, driver: AsyncpgDriver, entry: _Call, shared: dict[str, list[dict[str, Any]]]
    ) -> tuple[Caller, list[dict[str, Any]]] | BaseException:
        """One call of a batch, acting for its own token."""
        (who,) = await driver.fetch(queries.sql("tokens_act_for"), entry.token)
        caller = Caller(kind=who["kind"], identity=who["subject"])
        if caller.kind != "runner":
            return not_a_runner(caller)
        if entry.name == CHECK_ONLY:
            return caller, []
        if entry.name in SHARED and entry.name in shared:
            return caller, SHARED[entry.name](shared[entry.name])
        timeout_s = max(entry.timeout_s, MIN_TIMEOUT_S)
        rows = await self.run(driver, entry.name, entry.args, timeout_s)
        if entry.name in SHARED:
            shared[entry.name] = rows
        return caller, rows

    async def _alone(self, entry: _Call) -> None:
        try:
            _give(entry, await self.alone(entry.token, entry.name, entry.args, entry.timeout_s))
        except Exception as exc:
            # its token runs alone for a while: a call that fails every time must not
            # make every batch run twice
            self.set_aside[_digest(entry.token)] = time.monotonic() + SET_ASIDE_S
            if len(self.set_aside) >= _CHECKED_MAX:
                self.set_aside.clear()
            _give(entry, exc)


def batched(name: str, args: list[Any]) -> bool:
    """Whether a call waits for a batch (a routine one, of a routine size)."""
    if name == CHECK_ONLY:
        return True
    return name in BATCHED and len(json.dumps(args)) <= MAX_ARGS_BYTES


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _give(entry: _Call, answer: tuple[Caller, list[dict[str, Any]]] | BaseException) -> None:
    """Answer a call, unless its request has gone (the client hung up)."""
    if entry.answer.done():
        return
    if isinstance(answer, BaseException):
        entry.answer.set_exception(answer)
    else:
        entry.answer.set_result(answer)
