"""Keeping this runner's leases: renewal (each lease by its own length, as the database
answered it), the self-fence, stopping what this runner no longer holds, confirming
stops, the periodic collection pass, and handing leases back at shutdown. The self-fence
rule itself is in `fencing`, the beat's arithmetic in `policy`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

import asyncpg

from fleetq.core import fleet, leasing, queries
from fleetq.core.driver import Driver
from fleetq.core.errors import FleetqError, NotFound, StaleLease
from fleetq.core.models import FencingToken, JobId, RunnerId, RunnerState, WriteStatus
from fleetq.runner import loops, metrics, policy
from fleetq.runner.execution import Execution
from fleetq.runner.fencing import FenceRule
from fleetq.runner.outcomes import release_counted

log = logging.getLogger("fleetq.runner.service")


@dataclass(frozen=True)
class LeaseHooks:
    """What keeping the leases asks of the rest of the runner."""

    wake_lanes: Callable[[], None]  # room came free: every lane looks again
    follow_state: Callable[[], Awaitable[None]]  # read the runner's own row (each beat)
    reread_config: Callable[[], None]  # a lease was granted under settings not read here


class Leases:
    """The leases this runner holds: the executions it runs (only `Runs` adds or removes
    them) and those a claim or an earlier process left it with nothing running here."""

    def __init__(
        self,
        *,
        driver: Driver,
        runner: RunnerId,
        pool: asyncpg.Pool | None,
        executions: Mapping[JobId, Execution],
        superseded: Callable[[], Iterable[tuple[JobId, FencingToken]]],
        done: asyncio.Event,
        hooks: LeaseHooks,
    ) -> None:
        self.driver, self.runner, self.pool = driver, runner, pool
        self.executions, self.superseded = executions, superseded
        self.done, self.hooks = done, hooks
        self.lease_seconds = 30  # the settings, as last read (`read_timing`)
        self.offline_after_seconds = 30
        self.beat_wake = asyncio.Event()  # the beat looks again: a renewal may be due sooner
        # leases of this runner id the start-up collection left to a holder that may live
        self.inherited: set[tuple[JobId, FencingToken]] = set()
        # another process took this runner id over (our LISTEN session was gone for a
        # while): its leases are not ours to report lost, release or mark offline
        self.displaced = False
        self._renewal_sent: float | None = None  # the renewal in flight (diagnostics)
        self._next_beat = 0.0  # when the heartbeat loop means to renew next (monotonic)

    async def read_timing(self) -> None:
        """The lease setting and the offline threshold: the beat follows both (from its
        next look: woken here)."""
        rows = await self.driver.fetch(queries.sql("runners_lease_seconds"))
        lease, offline = int(rows[0]["lease_seconds"]), int(rows[0]["offline_after_seconds"])
        if (lease, offline) != (self.lease_seconds, self.offline_after_seconds):
            log.info(
                "settings: lease %ds, offline after %ds (were %ds, %ds)",
                lease,
                offline,
                self.lease_seconds,
                self.offline_after_seconds,
            )
        self.lease_seconds, self.offline_after_seconds = lease, offline
        self.beat_wake.set()

    def beat_s(self) -> float:
        """The runner's own beat: often enough for its lease setting and for the offline
        threshold alike (a lease shorter than the setting is renewed sooner: `renew_by`)."""
        return policy.beat_s(self.lease_seconds, self.offline_after_seconds)

    def lease_s(self, ex: Execution) -> float:
        """How long `ex`'s lease is good for after `ex.renewed_at`: what the database
        answered for it, else the lease setting."""
        return self.lease_seconds if ex.lease_s is None else ex.lease_s

    def due(self, ex: Execution) -> float:
        """When `ex`'s lease is due for renewal: a third of its own length after it was
        last renewed, so two renewals may fail before the self-fence."""
        return ex.renewed_at + self.lease_s(ex) / 3

    def renew_by(self, last: float) -> float:
        """When the next renewal is due (monotonic), the last one sent at `last`: a beat
        later, or sooner for a lease that is due first (one granted shorter than the
        setting: changed by `fleetq apply`), never sooner than MIN_BEAT_S after `last`."""
        due = min((self.due(ex) for ex in self.executions.values()), default=math.inf)
        return max(last + policy.MIN_BEAT_S, min(last + self.beat_s(), due))

    def renew_sooner(self, executions: Iterable[Execution]) -> None:
        """New leases (a claim, an adoption): wake the heartbeat loop if one is due
        before its next renewal."""
        if any(self.due(ex) < self._next_beat for ex in executions):
            self.beat_wake.set()

    async def heartbeats(self) -> None:
        """Renew every lease this runner holds (and say it is alive) in one statement, a
        beat apart, or sooner when a lease is due first (`renew_by`); woken when a new
        lease or new settings may move that time. A failure is retried sooner, backing
        off, never later than a beat (`loops.every`'s rule)."""
        backoff = loops.Backoff()
        last = time.monotonic()
        retry_at: float | None = None  # after a failure: when to try again
        while not self.done.is_set():
            self.beat_wake.clear()  # before reading the executions: no wake is lost
            self._next_beat = self.renew_by(last) if retry_at is None else retry_at
            wait = self._next_beat - time.monotonic()
            if wait > 0:
                await loops.wait_any((self.done, self.beat_wake), wait)
                continue  # look again: woken, done, or due now
            last = time.monotonic()
            try:
                await self.heartbeat_once()
            except Exception as exc:
                if (error := loops.environmental(exc)) is None:
                    raise
                delay = min(self.beat_s(), backoff.next())
                retry_at = time.monotonic() + delay
                log.warning("heartbeat failed (%s); retrying in %.1fs", error, delay)
                continue
            backoff.reset()
            retry_at = None

    async def heartbeat_once(self) -> None:
        asked = dict(self.executions)
        leases = [(j, ex.claim.lease_version) for j, ex in asked.items()]
        sent = time.monotonic()
        self._renewal_sent = sent
        try:
            answers = await leasing.heartbeat(self.driver, runner=self.runner, leases=leases)
        finally:
            self._renewal_sent = None
        took = time.monotonic() - sent
        metrics.HEARTBEAT_LAG.set(took)
        if took > self.beat_s():
            log.warning("renewal took %.1fs (%s)", took, self.pool_use())
        for answer in answers:
            if (ex := self.executions.get(answer.job_id)) is None:
                continue
            if answer.status == WriteStatus.OK:
                ex.renewed(sent, left := answer.lease_left_s)
                # left is what was granted less at most this round trip: anything else
                # was granted under another setting than this runner read (one changed
                # with no notice it heard): read the settings again
                if left is not None and not self.lease_seconds - took - 1 < left <= (
                    self.lease_seconds
                ):
                    self.hooks.reread_config()
            elif answer.status == WriteStatus.BUSY and ex.in_transaction:
                # its row is locked by this run's own handler transaction: nobody can take
                # the lease while it is (claims take queued jobs; the reaper skips it),
                # and the transaction renews it before it lets the row go (context.py)
                ex.renewed_at = sent
            elif answer.status == WriteStatus.BUSY:
                log.warning(
                    "lease of job=%d token=%d not renewed: another transaction holds its row",
                    answer.job_id,
                    ex.claim.lease_version,
                )
        stale = [a.job_id for a in answers if a.status == WriteStatus.STALE]
        for job in stale:
            # a renewal that raced this run's own recorded outcome is benign
            kind = "self_race" if asked[job].recorded else "zombie"
            metrics.STALE.labels("heartbeat", kind).inc()
        if stale:
            await self.stop_lost(stale)
        await self.hooks.follow_state()

    def pool_use(self) -> str:
        pool = self.pool
        if pool is None:
            return "served through the API"
        busy = pool.get_size() - pool.get_idle_size()
        return f"{busy} of {pool.get_max_size()} pooled connections in use"

    async def stop_lost(self, job_ids: list[JobId]) -> None:
        """Stop local executions whose lease this runner no longer holds."""
        rows = await self.driver.fetch(queries.sql("lease_job_states"), self.runner, job_ids)
        for gone in set(job_ids) - {row["job_id"] for row in rows}:
            # no longer in the database at all (pruned after it ended elsewhere)
            if (ex := self.executions.get(gone)) is not None:
                log.info("stopping job=%d token=%d: the job is gone", gone, ex.claim.lease_version)
                ex.request_stop("superseded")
        for row in rows:
            ex = self.executions.get(row["job_id"])
            if ex is None:
                continue
            held = (
                row["lease_owner"] == self.runner
                and row["lease_version"] == ex.claim.lease_version
                and row["state"] in ("claimed", "running")
            )
            if not held:
                reason = "cancelled" if row["state"] == "cancelled" else "superseded"
                log.info(
                    "stopping job=%d token=%d: %s", ex.claim.job_id, ex.claim.lease_version, reason
                )
                ex.request_stop(reason)

    async def self_fence_once(self) -> None:
        """Stop executions whose lease may expire unrenewed (the database is out of
        reach) so that the stop, SIGKILL included, is over before the database could
        expire the lease: the rule and its budget are in `fencing`."""
        now = time.monotonic()
        for ex in list(self.executions.values()):
            rule = FenceRule(self.lease_s(ex))  # the length the database gave this lease
            if ex.ended_monotonic is not None:
                # Its process is over and its outcome waits to be written: nothing to
                # stop. The write is fenced by the database (owner and token): it lands
                # if the lease is still ours then, and is refused if the job moved on.
                # Fencing it would record a finished run as stopped, and could hand the
                # job back before its outcome, so that a run that succeeded ran again.
                continue
            if ex.stop_reason is None and rule.due(ex.renewed_at, now):
                pending = self._renewal_sent
                log.warning(
                    "self-fencing job=%d token=%d: lease not renewed for %.1fs (the database "
                    "could expire it in %.1fs; %s; %s)",
                    ex.claim.job_id,
                    ex.claim.lease_version,
                    now - ex.renewed_at,
                    rule.lease_s - (now - ex.renewed_at),
                    "no renewal in flight"
                    if pending is None
                    else f"a renewal in flight for {now - pending:.1f}s",
                    self.pool_use(),
                )
                ex.request_stop("self_fenced", grace_s=rule.grace_s)

    async def confirm(self, ex: Execution, reason: str) -> None:
        c = ex.claim
        try:
            if reason == "self_fenced":
                # Fenced blind (the database was unreachable); now that it answers, say
                # what really happened meanwhile: superseded or cancelled wins.
                rows = await self.driver.fetch(
                    queries.sql("lease_job_states"), self.runner, [c.job_id]
                )
                if not rows:
                    raise NotFound(f"job {c.job_id}")
                (row,) = rows
                if row["state"] == "cancelled":
                    reason = "cancelled"
                elif row["lease_version"] != c.lease_version:
                    reason = "superseded"
            await leasing.confirm_stop(
                self.driver,
                runner=self.runner,
                job_id=c.job_id,
                token=c.lease_version,
                signal=ex.signal,
                reason=reason,
                ended_monotonic=ex.end_seen,
            )
        except NotFound:
            # Pruned (`fleetq prune`) after it ended under another runner: there is no
            # row left to record the stop on, and retrying would never end.
            log.warning(
                "stop of job=%d token=%d not recorded: the job is no longer in the database",
                c.job_id,
                c.lease_version,
            )
            return
        log.info("stop confirmed job=%d token=%d reason=%s", c.job_id, c.lease_version, reason)
        if reason == "self_fenced":
            # If the lease is somehow still ours (only our connection was cut), hand it
            # back so the job runs again now rather than at expiry.
            # Counted as a reassignment: a job cannot cycle through self-fences for ever.
            await release_counted(
                self.driver, self.runner, c, "self-fenced", ended_monotonic=ex.end_seen
            )

    async def drain_self(self, reason: str) -> None:
        await fleet.set_state(
            self.driver,
            runner=self.runner,
            state=RunnerState.DRAINING,
            reason=reason,
            actor=self.runner,
        )

    async def strays_once(self) -> None:
        """The periodic collection pass: what the database says this runner holds but
        nothing here runs (say, a claim whose reply was lost for good) is settled now
        rather than at lease expiry. Claims younger than a lease are left alone: their
        answer may still be on its way to the claim loop; so are leases start-up left to
        a holder that may live (`inherited`), for as long as this runner id holds them."""
        if self.displaced:
            return
        await self.close_unrun_executions()
        rows = await self.driver.fetch(queries.sql("lease_held_by"), self.runner)
        self.inherited &= {(r["job_id"], r["lease_version"]) for r in rows}
        for row in rows:
            job, token = JobId(row["job_id"]), FencingToken(row["lease_version"])
            if (
                job in self.executions
                or (job, token) in self.inherited
                or (row["held_s"] or 0) < self.lease_seconds
            ):
                continue
            if row["state"] == "cancelled":
                await self.stop_unrun(job, token, "cancelled")
                continue
            with contextlib.suppress(StaleLease):
                status = await leasing.report_lost(
                    self.driver,
                    runner=self.runner,
                    job_id=job,
                    token=token,
                    reason="held but not running",
                )
                log.warning(
                    "stray job=%d token=%d held but not running here: %s", job, token, status
                )

    async def close_unrun_executions(self) -> None:
        """Executions of this runner with no end, whose lease moved on while nothing ran
        here (an expired handler's lease records its execution open; if the claim's
        reply was lost, this runner never ran it), are closed with their end bounded by
        now: nothing else would ever close them. Run by the strays pass and at shutdown."""
        here = {(ex.claim.job_id, ex.claim.lease_version) for ex in self.executions.values()}
        here |= set(self.superseded())
        for row in await self.driver.fetch(queries.sql("lease_open_executions"), self.runner):
            key = (JobId(row["job_id"]), FencingToken(row["lease_version"]))
            if row["held"] or key in here:
                continue
            log.info("closing execution job=%d token=%d: nothing runs it here", *key)
            await self.stop_unrun(*key, "superseded")

    async def stop_unrun(self, job: JobId, token: FencingToken, reason: str) -> None:
        """Confirm the stop of a job nothing runs here. If the job was cancelled, its slot
        and room are free once this commits, and no notification says so: the lanes look
        now, or one full until this moment would wait for its next poll."""
        await leasing.confirm_stop(
            self.driver, runner=self.runner, job_id=job, token=token, signal=None, reason=reason
        )
        self.hooks.wake_lanes()

    async def held_but_not_here(
        self, known: set[JobId]
    ) -> list[tuple[JobId, FencingToken, float | None]]:
        """Leases the database says this runner holds with nothing running here: a claim
        whose reply was lost, an outcome that could not be recorded. Handed back too."""
        try:
            rows = await self.driver.fetch(queries.sql("lease_held_by"), self.runner)
        except FleetqError:
            return []
        return [
            (JobId(r["job_id"]), FencingToken(r["lease_version"]), None)
            for r in rows
            if r["state"] in ("claimed", "running")
            and r["job_id"] not in known
            and (r["job_id"], r["lease_version"]) not in self.inherited
        ]

    async def release_all(self, held: list[tuple[JobId, FencingToken, float | None]]) -> None:
        """Hand leases back (requeued at once, not counted as lost). With the database
        out of reach, the rest are left to expire rather than tried one by one."""
        for i, (job, token, ended) in enumerate(held):
            try:
                await leasing.release(
                    self.driver,
                    runner=self.runner,
                    job_id=job,
                    token=token,
                    reason="runner shutdown",
                    ended_monotonic=ended,
                )
                log.info("released job=%d token=%d (requeued)", job, token)
            except StaleLease:
                continue
            except FleetqError as exc:
                if not loops.transient(exc):
                    log.warning("could not release job=%d token=%d: %s", job, token, exc)
                    continue
                log.warning(
                    "database out of reach (%s): %d lease(s) left to expire", exc, len(held) - i
                )
                return
