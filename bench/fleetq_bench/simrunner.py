"""A simulated fleetq-runner: the real runner's protocol calls at its cadence, with no job
processes, so one Python process can stand for a fleet of a hundred.

What it does, and whose code does it:
- registers with `fleet.register`, as the runner does at start-up;
- one claim loop for its lane, shaped as `runner.claiming`'s and paced by the runner's
  own claim policy (`runner.policy`): it claims `min(batch, free slots)` with
  `leasing.claim` and a fresh claim id, claims again at once when the claim came back
  full, and otherwise waits for a NOTIFY on `fleetq_work` or the poll interval, which
  doubles while polls find nothing, up to the longest (`runner.config` defaults);
- wake-ups as the runner's `control` takes them: a NOTIFY naming its lane alone, or its
  lane and this runner, wakes the claim loop; one naming another runner is looked after
  once, `control.LOOKOUT_S` later (a full runner named for a job does not forward it);
- per claimed job: `leasing.report_start`, then the outcome through the runner's own
  batching `Reporter` (one fenced `complete` for whatever is pending), which carries the
  claim for the room the batch frees (`Refill`, sized by `runner.policy` as the runner's: the
  same transaction); a job whose refill found the lane empty does not wake the loop;
- the periodic passes with the runner's own intervals: heartbeat (`leasing.heartbeat` and
  the read of its own state) every beat, the reaper pass, the due ticks of its lane's
  schedules (`schedules.MinuteChecks`: a look on the first reaper-cadence pass after each
  minute), the collection pass's two reads every lease, a ping of the LISTEN session
  every `control.PING_S`.

By design, unlike a real runner: everything goes over ONE connection (a real runner has a
pool of up to 4 + lanes connections and a LISTEN connection of its own), so a simulated
runner's own calls queue behind each other; there is no staging, process or journal, and a
job "runs" for `job_s` seconds.

Through a gateway (`api`), as `fleetq-runner --api`: the runner's own `ApiDriver` (calls
side by side), the id held and renewed as `wakes.ApiControl` holds it, the gateway's long
poll for wake-ups in place of LISTEN and its ping.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, LiteralString

import asyncpg

from fleetq import __version__
from fleetq.core import errors, fleet, leasing, queries, schedules
from fleetq.core.driver import DEFAULT_TIMEOUT_S, AsyncpgDriver, prepare_asyncpg
from fleetq.core.models import (
    Claim,
    JobId,
    Outcome,
    OutcomeReport,
    Registration,
    RunnerId,
    RunnerState,
    StartReport,
    WriteStatus,
)
from fleetq.runner import config as runner_config
from fleetq.runner import control, loops, policy
from fleetq.runner.remote import ApiDriver
from fleetq.runner.reporter import Refill, Reporter
from fleetq.runner.wakes import HOLD_S

CLAIM = queries.sql("lease_claim")
RETRIES = 6
REFILL = queries.sql("lease_complete_and_claim")


@dataclass(frozen=True)
class Cadence:
    """The real runner's intervals (seconds), read from its own modules."""

    poll_s: float = runner_config.DEFAULT_POLL_S
    poll_max_s: float = runner_config.DEFAULT_POLL_MAX_S
    reap_s: float = runner_config.DEFAULT_REAP_S
    ping_s: float = control.PING_S
    schedules_s: float = schedules.MINUTE_S  # one look a minute for due ticks

    @staticmethod
    def beat_s(lease_s: float, offline_s: float) -> float:
        """The runner's own beat (`policy.beat_s`)."""
        return policy.beat_s(lease_s, offline_s)


class SerialDriver:
    """A simulated runner's way to the database, shared by its loops, each claim's round
    trip timed; outcome batches that carry a claim (the refill) are timed apart: their
    round trip is outcomes and claim together.

    Direct (`serial`): one connection, one statement at a time (asyncpg refuses
    overlapping calls on a connection), each claim timed from the moment the connection
    was its own, so queueing behind the runner's other calls is not counted as the
    claim's cost. Through the API: the runner's own `ApiDriver`, calls side by side as a
    real runner's are."""

    def __init__(self, inner: AsyncpgDriver | ApiDriver, *, serial: bool = True) -> None:
        self.inner = inner
        self.lock = asyncio.Lock() if serial else None
        self.claims: list[tuple[float, int]] = []  # (seconds, jobs claimed)
        self.refills: list[tuple[float, int]] = []  # outcomes with a claim: (seconds, jobs)
        self.retried = 0  # calls sent again after a lost reply (through a gateway)

    async def fetch(
        self, query: LiteralString, *args: object, timeout: float = DEFAULT_TIMEOUT_S
    ) -> list[dict[str, Any]]:
        """Run one statement (when the connection is free); time it if it is a claim."""
        async with self.lock or contextlib.nullcontext():
            start = time.perf_counter()
            rows = await self._fetch(query, *args, timeout=timeout)
            if query == CLAIM:
                self.claims.append((time.perf_counter() - start, len(rows)))
            elif query == REFILL:
                took = sum(1 for r in rows if r["kind"] == "claim")
                self.refills.append((time.perf_counter() - start, took))
        return rows

    async def _fetch(
        self, query: LiteralString, *args: object, timeout: float
    ) -> list[dict[str, Any]]:
        """Through a gateway, a call whose reply was lost is sent again, as the runner's
        loops send it (the protocol answers a repeat as the first: a claim by its id, a
        write with `already`); a direct connection's failure ends the benchmark."""
        for attempt in range(RETRIES):
            try:
                return await self.inner.fetch(query, *args, timeout=timeout)
            except (errors.ConnectionFailed, errors.QueryTimeout):
                if self.lock is not None or attempt == RETRIES - 1:
                    raise
                self.retried += 1
                await asyncio.sleep(0.1 * 2**attempt)  # a backoff, not a synchronisation
        raise AssertionError("unreachable")

    async def close(self) -> None:
        """Close the connection."""
        await self.inner.close()


class SimRunner:
    """One simulated runner with `slots` slots in one lane (see the module's docstring)."""

    def __init__(
        self,
        dsn: str,
        *,
        node: str,
        lane: str,
        slots: int,
        batch: int = runner_config.DEFAULT_BATCH,
        job_s: float = 0.0,
        cadence: Cadence | None = None,
        listen: bool = True,
        api: tuple[str, str] | None = None,
    ) -> None:
        self.dsn, self.node, self.lane, self.slots = dsn, node, lane, slots
        self.api = api  # through a gateway: its URL and this runner's token
        self.batch, self.job_s, self.listen = batch, job_s, listen
        self.cadence = cadence or (
            Cadence(
                poll_max_s=runner_config.DEFAULT_POLL_MAX_API_S,
                reap_s=runner_config.DEFAULT_REAP_API_S,
            )
            if api
            else Cadence()
        )
        self.runner = RunnerId(f"{node}/runner")
        self.wake = asyncio.Event()
        self.running: dict[JobId, Claim] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        # fenced writes answered stale while the lease was this runner's to hold (must
        # stay 0: nobody else claims these jobs, and no lease expires in a bench)
        self.stale = 0
        # heartbeats that named a job whose outcome was being recorded meanwhile: benign,
        # and counted apart as the runner counts them (`self_race`)
        self.self_races = 0
        self.finishing: set[JobId] = set()  # outcomes handed to the reporter
        # jobs whose outcome's refill claim came back short: their end needs no new look
        self.looked_after: set[JobId] = set()
        self.lookout: asyncio.TimerHandle | None = None
        self.schedule_checks = schedules.MinuteChecks()
        self.lease_s = 30.0
        self.offline_s = 30.0

    async def connect(self) -> None:
        """Open the connection, register, learn the lease, and LISTEN for work (unless
        told not to: then it finds work by its polls and its own finished jobs only).
        Through a gateway: the runner's own `ApiDriver`, its id held as the real one
        holds it (`wakes.HOLD_S`), wake-ups by the gateway's long poll."""
        conn: asyncpg.Connection | None = None
        if self.api is not None:
            self.driver = SerialDriver(ApiDriver(*self.api), serial=False)
            await self._hold()
        else:
            conn = await asyncpg.connect(
                self.dsn, timeout=10, server_settings={"application_name": "fleetq-bench-sim"}
            )
            await prepare_asyncpg(conn)
            self.driver = SerialDriver(AsyncpgDriver(conn))
        self.reporter = Reporter(
            self.driver, self.runner, refill_for=self._refill_for, refilled=self._refilled
        )
        await fleet.register(
            self.driver,
            Registration(
                node=self.node,
                name="runner",
                memory_mb=1024 * self.slots,
                cpu_millis=1000 * self.slots,
                lanes={self.lane: self.slots},
                version=__version__,
                pid=os.getpid(),
            ),
        )
        (row,) = await self.driver.fetch(queries.sql("runners_lease_seconds"))
        self.lease_s = float(row["lease_seconds"])
        self.offline_s = float(row["offline_after_seconds"])
        if self.listen and conn is not None and self.driver.lock is not None:
            async with self.driver.lock:
                await conn.add_listener("fleetq_work", self._on_work)

    async def _hold(self) -> None:
        """Hold the runner id, as `wakes.ApiControl.hold` does (every HOLD_S / 3)."""
        (row,) = await self.driver.fetch(
            queries.sql("runners_hold_identity"), self.runner, f"bench {self.node}", HOLD_S
        )
        if not row["taken"]:
            raise RuntimeError(f"runner id {self.runner} is held by {row['holder']}")

    async def _follow(self, stop: asyncio.Event) -> None:
        """The gateway's notices, by long poll, as `wakes.ApiControl` follows them."""
        assert isinstance(self.driver.inner, ApiDriver)
        cursor: str | None = None
        while not stop.is_set():
            poll = asyncio.ensure_future(self.driver.inner.wake(cursor))
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({poll, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not poll.done():
                poll.cancel()
                return
            try:
                wake = poll.result()
            except (errors.ConnectionFailed, errors.QueryTimeout):
                self.driver.retried += 1
                cursor = None  # as the runner: every lane looks once, then polls again
                self.wake.set()
                await asyncio.sleep(0.5)  # a backoff, not a synchronisation
                continue
            if wake.get("gap"):
                self.wake.set()
            cursor = str(wake.get("next") or "") or None
            for notice in wake.get("notices") or []:
                if notice.get("channel") == "fleetq_work":
                    self._on_work(None, 0, "fleetq_work", notice.get("payload"))

    def _on_work(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        lane, _, chosen = str(payload).partition(" ")
        if lane != self.lane:
            return
        if not chosen or chosen == self.runner:
            self.wake.set()
        elif self.lookout is None:
            self.lookout = asyncio.get_running_loop().call_later(
                min(self.cadence.poll_s, control.LOOKOUT_S), self._look
            )

    def _look(self) -> None:
        self.lookout = None
        self.wake.set()

    def _refill_for(self, reports: list[OutcomeReport]) -> Refill | None:
        """The claim the runner sends with these outcomes (`Claiming._refill_for`)."""
        jobs = frozenset(
            r.job_id
            for r in reports
            if (c := self.running.get(r.job_id)) is not None and c.lease_version == r.lease_version
        )
        limit = policy.refill_limit(
            batch=self.batch, slots=self.slots, running=len(self.running), freed=len(jobs)
        )
        if not jobs or limit < 1:
            return None
        return Refill(
            lane=self.lane, limit=limit, claim_id=uuid.uuid4(), sent=time.monotonic(), jobs=jobs
        )

    def _refilled(self, claims: list[Claim], refill: Refill) -> None:
        for claim in claims:
            self._launch(claim)
        if len(claims) < refill.limit:
            self.looked_after.update(JobId(j) for j in refill.jobs)

    async def serve(self, stop: asyncio.Event) -> None:
        """Claim and run jobs until `stop`; then let running jobs end and flush outcomes."""
        c = self.cadence
        reporter_stop = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.reporter.run(reporter_stop))
            passes: list[tuple[str, Callable[[], float], Callable[[], Awaitable[None]]]] = [
                ("heartbeat", lambda: c.beat_s(self.lease_s, self.offline_s), self._heartbeat),
                ("reap", lambda: c.reap_s, self._reap),
                ("schedules", lambda: c.reap_s, self._schedules),
                ("collection", lambda: self.lease_s, self._collect),
            ]
            if self.api is None:
                passes.append(("ping", lambda: c.ping_s, self._ping))  # its LISTEN session
            else:
                passes.append(("hold", lambda: HOLD_S / 3, self._hold))
                tg.create_task(self._follow(stop))
            for what, interval, work in passes:
                tg.create_task(loops.every(interval, what, work, stop))
            await self._claim_loop(stop)
            if self.tasks:
                await asyncio.wait(self.tasks)
            reporter_stop.set()
            self.reporter.wake.set()

    async def close(self) -> None:
        """Say offline, as a runner that shuts down does, and close the connection."""
        await fleet.set_state(
            self.driver,
            runner=self.runner,
            state=RunnerState.OFFLINE,
            reason="bench over",
            actor=self.runner,
        )
        await self.driver.close()

    async def _claim_loop(self, stop: asyncio.Event) -> None:
        idle_wait = self.cadence.poll_s
        while not stop.is_set():
            self.wake.clear()  # before claiming: a hint that arrives meanwhile is not lost
            limit = policy.claim_limit(
                batch=self.batch, slots=self.slots, running=len(self.running)
            )
            if limit > 0:
                claims = await leasing.claim(
                    self.driver, runner=self.runner, lane=self.lane, limit=limit
                )
                for claim in claims:
                    self._launch(claim)
                if claims:
                    idle_wait = self.cadence.poll_s
                if policy.more_behind(taken=len(claims), limit=limit):
                    continue  # there may be more right behind
            stopped = asyncio.ensure_future(stop.wait())
            woken = asyncio.ensure_future(self.wake.wait())
            done, _ = await asyncio.wait(
                {stopped, woken}, timeout=idle_wait, return_when=asyncio.FIRST_COMPLETED
            )
            stopped.cancel()
            woken.cancel()
            if done:
                idle_wait = self.cadence.poll_s  # woken: work may be about again
            else:
                idle_wait = policy.next_wait(
                    idle_wait, poll_s=self.cadence.poll_s, poll_max_s=self.cadence.poll_max_s
                )

    def _launch(self, claim: Claim) -> None:
        self.running[claim.job_id] = claim
        task = asyncio.create_task(self._job(claim))
        self.tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)

    async def _job(self, claim: Claim) -> None:
        try:
            try:
                await leasing.report_start(
                    self.driver,
                    runner=self.runner,
                    start=StartReport(
                        job_id=claim.job_id,
                        lease_version=claim.lease_version,
                        node=self.node,
                        run_id=uuid.uuid4(),
                        pid=os.getpid(),
                        process_started_at=datetime.now(UTC),
                        prepare_ms=0,
                    ),
                )
            except errors.StaleLease:
                self.stale += 1  # the lease ran out before its start report arrived
                return
            if self.job_s > 0:
                await asyncio.sleep(self.job_s)  # the simulated job's run time
            self.finishing.add(claim.job_id)
            status = await self.reporter.record(
                OutcomeReport(
                    job_id=claim.job_id,
                    lease_version=claim.lease_version,
                    outcome=Outcome.SUCCEEDED,
                    exit_code=0,
                    prepare_ms=0,
                    run_ms=round(self.job_s * 1000),
                    ended_monotonic=time.monotonic(),
                )
            )
            if status == WriteStatus.STALE:
                self.stale += 1
        finally:
            self.running.pop(claim.job_id, None)
            self.finishing.discard(claim.job_id)
            if claim.job_id in self.looked_after:
                self.looked_after.discard(claim.job_id)  # its refill found the lane empty
            else:
                self.wake.set()  # a slot is free

    async def _heartbeat(self) -> None:
        leases = [(job, c.lease_version) for job, c in self.running.items()]
        answers = await leasing.heartbeat(self.driver, runner=self.runner, leases=leases)
        for answer in answers:
            if answer.status != WriteStatus.STALE:
                continue
            if answer.job_id in self.finishing or answer.job_id not in self.running:
                self.self_races += 1
            else:
                self.stale += 1
        await self.driver.fetch(queries.sql("runners_get_state"), self.runner)

    async def _reap(self) -> None:
        await leasing.reap(self.driver)

    async def _schedules(self) -> None:
        await self.schedule_checks.check(self.driver, self.runner)

    async def _collect(self) -> None:
        await self.driver.fetch(queries.sql("lease_open_executions"), self.runner)
        await self.driver.fetch(queries.sql("lease_held_by"), self.runner)

    async def _ping(self) -> None:
        await self.driver.fetch("SELECT 1", timeout=5)  # as the LISTEN session's ping


def runner_id(prefix: str, i: int) -> RunnerId:
    """The id of `start_fleet`'s i-th runner (what a gateway's token is made for)."""
    return RunnerId(f"{prefix}{i}/runner")


async def start_fleet(
    dsn: str,
    count: int,
    *,
    prefix: str,
    lane: str,
    slots: int,
    apis: list[tuple[str, str]] | None = None,
    **options: Any,
) -> list[SimRunner]:
    """`count` connected, registered runners named prefix0, prefix1, ... (not serving);
    through a gateway each, when `apis` gives each its URL and token."""
    fleet_ = [
        SimRunner(
            dsn,
            node=runner_id(prefix, i).partition("/")[0],
            lane=lane,
            slots=slots,
            api=apis[i] if apis is not None else None,
            **options,
        )
        for i in range(count)
    ]
    await asyncio.gather(*(r.connect() for r in fleet_))
    return fleet_


class Serving:
    """A fleet serving in the background, stopped and closed on exit."""

    def __init__(self, fleet_: list[SimRunner]) -> None:
        self.fleet = fleet_
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Serving:
        self.tasks = [asyncio.create_task(r.serve(self.stop)) for r in self.fleet]
        return self

    async def __aexit__(self, *_exc: object) -> None:
        self.stop.set()
        results = await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.gather(*(r.close() for r in self.fleet), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result

    def alive(self) -> None:
        """Raise what ended a runner early (a wait's `alive` check)."""
        for task in self.tasks:
            if task.done() and not task.cancelled() and (exc := task.exception()) is not None:
                raise exc

    def claims(self) -> list[tuple[float, int]]:
        """Every claim's (round trip seconds, jobs) since the last `reset`."""
        return [c for r in self.fleet for c in r.driver.claims]

    def refills(self) -> list[tuple[float, int]]:
        """Every outcome batch that carried a claim: (round trip seconds, jobs claimed)."""
        return [c for r in self.fleet for c in r.driver.refills]

    def reset(self) -> None:
        """Forget the claims timed so far (after a warm-up)."""
        for r in self.fleet:
            r.driver.claims.clear()
            r.driver.refills.clear()

    def retried(self) -> int:
        """Calls sent again after a lost reply, across the fleet (through a gateway)."""
        return sum(r.driver.retried for r in self.fleet)

    def stale(self) -> tuple[int, int]:
        """Across the fleet: fenced writes answered stale (must be 0), and heartbeats
        that raced their runner's own recorded outcome (benign)."""
        return sum(r.stale for r in self.fleet), sum(r.self_races for r in self.fleet)
