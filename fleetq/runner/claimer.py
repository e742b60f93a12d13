"""Claiming: one loop per lane, so a long `checks` job never delays a `control`
operation. A claim is sized by the lane's free slots (the database checks memory, CPUs
and capabilities in the same statement; the arithmetic is `policy`'s), retried with the
same claim id after an error (a claim that committed is returned, not lost), and its
lease's clock starts when that claim id was first sent (`fencing`). A job a claim took
whose row cannot be used was refused by the claim itself (`leasing.Claims.refused`):
logged here, never launched, and its room is looked for again at once.

`Claimers` owns the lanes' wake-ups and the claims outcome batches carry (refills); what
it needs of the runner (whether it claims, launching a run, renewing new leases sooner)
is passed in, and the executions it sizes claims by are the runner's, read only."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from fleetq.core import leasing
from fleetq.core.driver import Driver
from fleetq.core.models import Claim, JobId, OutcomeReport, RunnerId
from fleetq.runner import loops, metrics, policy
from fleetq.runner.config import RunnerConfig
from fleetq.runner.execution import Execution
from fleetq.runner.reporter import Refill

log = logging.getLogger("fleetq.runner.service")


@dataclass(frozen=True)
class RunnerHooks:
    """What the claimers ask of the runner that holds the executions."""

    executions: Callable[[], Mapping[JobId, Execution]]  # the runner's, read only
    claiming: Callable[[], bool]  # active and not shutting down
    launch: Callable[[Claim, str, float], None]  # claim, lane, when its claim was sent
    renew_sooner: Callable[[Iterable[Execution]], None]  # new leases: maybe renew sooner


class Claimers:
    """Every lane's claim loop, its wake-up, and the claims sent with outcomes."""

    def __init__(
        self,
        *,
        config: RunnerConfig,
        runner: RunnerId,
        stop: asyncio.Event,
        hooks: RunnerHooks,
    ) -> None:
        self.config, self.runner = config, runner
        self.stop, self.hooks = stop, hooks
        self.wakes = {lane: asyncio.Event() for lane in config.lanes}
        # jobs whose outcome's refill found their lane empty: their end wakes no loop
        self.looked_after: set[JobId] = set()
        for lane in config.lanes:  # read when scraped: nothing to count per job
            metrics.SLOTS_IN_USE.labels(lane).set_function(functools.partial(self.running_in, lane))

    @property
    def executions(self) -> Mapping[JobId, Execution]:
        """The runner's executions, which claims are sized by."""
        return self.hooks.executions()

    def running_in(self, lane: str) -> int:
        """How many of this runner's executions run in `lane`."""
        return sum(1 for ex in self.executions.values() if ex.lane == lane)

    def wake_all(self) -> None:
        """Every claim loop looks again now (a state change, shutdown)."""
        for wake in self.wakes.values():
            wake.set()

    async def loop(self, lane: str, driver: Driver) -> None:
        """Claim for `lane` until stopped: at once while claims come back full, else
        when woken or the (doubling) poll interval passes."""
        wake = self.wakes[lane]
        claim_id = uuid.uuid4()
        sent: float | None = None  # when this claim id was first sent: its lease's clock
        backoff = loops.Backoff()
        idle_wait = self.config.poll_interval_s  # doubles while polls find nothing
        while not self.stop.is_set():
            wake.clear()  # before claiming: a hint that arrives meanwhile is not lost
            limit = policy.claim_limit(
                batch=self.config.batch,
                slots=self.config.lanes[lane],
                running=self.running_in(lane),
            )
            if self.hooks.claiming() and limit > 0:
                if sent is None:
                    sent = time.monotonic()
                try:
                    claims = await leasing.claim(
                        driver, runner=self.runner, lane=lane, limit=limit, claim_id=claim_id
                    )
                except Exception as exc:
                    if (error := loops.environmental(exc)) is None:
                        raise
                    # same claim id on retry: a claim that committed is returned, not lost
                    delay = await backoff.sleep(self.stop)
                    log.warning(
                        "claim failed lane=%s (%s); retried after %.1fs", lane, error, delay
                    )
                    continue
                backoff.reset()
                claim_id, claimed_at, sent = uuid.uuid4(), sent, None
                self._took(claims, lane, claimed_at, "claim")
                if claims:
                    idle_wait = self.config.poll_interval_s
                if policy.more_behind(taken=claims.taken, limit=limit):
                    continue  # there may be more right behind
            try:
                await asyncio.wait_for(wake.wait(), idle_wait)
                idle_wait = self.config.poll_interval_s  # woken: work may be about again
            except TimeoutError:
                idle_wait = policy.next_wait(
                    idle_wait, poll_s=self.config.poll_interval_s, poll_max_s=self.config.poll_max_s
                )

    def _took(self, claims: leasing.Claims, lane: str, claimed_at: float, kind: str) -> None:
        """Launch what a claim took; `claimed_at` is when it was first sent, `kind` the
        claim loop's ("claim") or an outcome batch's ("refill")."""
        metrics.CLAIMS.labels(lane).inc(claims.taken)
        if not claims.taken:
            metrics.EMPTY_CLAIMS.labels(kind).inc()
        for unusable in claims.refused:
            log.warning(
                "refused job=%d token=%d lane=%s: %s",
                unusable.job_id,
                unusable.lease_version,
                lane,
                unusable.reason,
            )
        if claims.refused:
            metrics.outcome("refused").inc(len(claims.refused))
            self.wakes[lane].set()  # their room is free again: look for more now
        for c in claims:
            self.hooks.launch(c, lane, claimed_at)
        # a lease shorter than the setting (changed meanwhile), or a retried claim's (it
        # dates from its first send), may be due before the next renewal: renew it then
        # rather than let it expire, or the self-fence stop a run that just began
        self.hooks.renew_sooner(self.executions[c.job_id] for c in claims)

    def refill_for(self, reports: list[OutcomeReport]) -> Refill | None:
        """The claim to send with these outcomes: the room they free in the lane most of
        them ran in, and what is free there already (the outcome writer asks, per batch).
        None while the runner is not claiming."""
        if not self.hooks.claiming():
            return None
        ran = {
            r.job_id: ex.lane
            for r in reports
            if (ex := self.executions.get(r.job_id)) is not None
            and ex.claim.lease_version == r.lease_version
        }
        if (chosen := policy.refill_lane(ran)) is None:
            return None
        lane, jobs = chosen
        limit = policy.refill_limit(
            batch=self.config.batch,
            slots=self.config.lanes[lane],
            running=self.running_in(lane),
            freed=len(jobs),
        )
        if limit < 1:
            return None
        return Refill(
            lane=lane,
            limit=limit,
            claim_id=uuid.uuid4(),
            sent=time.monotonic(),
            jobs=frozenset(jobs),
        )

    def refilled(self, claims: leasing.Claims, refill: Refill) -> None:
        """Launch what an outcome batch's claim took."""
        self._took(claims, refill.lane, refill.sent, "refill")
        if claims.taken < refill.limit:
            # the claim found the lane empty for this runner right after these jobs freed
            # their room: their ends need not wake the claim loop to look again
            self.looked_after.update(JobId(j) for j in refill.jobs)

    def ended(self, ex: Execution) -> None:
        """A run ended: its lane looks for work again, unless its outcome's refill found
        the lane empty already."""
        job_id, lane = ex.claim.job_id, ex.lane
        if job_id in self.looked_after:
            self.looked_after.discard(job_id)
        else:
            self.wakes[lane].set()
        if ex.claim.memory_mb or ex.claim.cpu_millis:
            # Memory and CPUs are the runner's, not the lane's: a job of another lane may
            # have waited for what this one gave back (its lane's claim loop would
            # otherwise look only at its next poll, up to --poll-max away).
            for other, wake in self.wakes.items():
                if other != lane:
                    wake.set()
