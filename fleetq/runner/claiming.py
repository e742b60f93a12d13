"""Claiming: one loop per lane, so a long `checks` job never delays a `control`
operation. A claim is sized by the lane's free slots (the database checks memory, CPUs
and capabilities in the same statement), retried with the same claim id after an error
(a claim that committed is returned, not lost), and its lease's clock starts when that
claim id was first sent (`fencing`). A job a claim took whose row cannot be used was
refused by the claim itself (`leasing.Claims.refused`): logged here, never launched, and
its room is looked for again at once."""

from __future__ import annotations

import asyncio
import time
import uuid

from fleetq.core import leasing
from fleetq.core.models import JobId, OutcomeReport, RunnerState
from fleetq.runner import loops, metrics, policy
from fleetq.runner.base import RunnerBase, log
from fleetq.runner.reporter import Refill


class Claiming(RunnerBase):
    """The claim loops."""

    def _claiming(self) -> bool:
        return self.state == RunnerState.ACTIVE and not self.shutdown_requested.is_set()

    def _running_in(self, lane: str) -> int:
        return sum(1 for ex in self.executions.values() if ex.lane == lane)

    async def _claim_loop(self, lane: str) -> None:
        wake = self.wakes[lane]
        claim_id = uuid.uuid4()
        sent: float | None = None  # when this claim id was first sent: its lease's clock
        backoff = loops.Backoff()
        idle_wait = self.config.poll_interval_s  # doubles while polls find nothing
        while not self.shutdown_requested.is_set():
            wake.clear()  # before claiming: a hint that arrives meanwhile is not lost
            limit = policy.claim_limit(
                batch=self.config.batch,
                slots=self.config.lanes[lane],
                running=self._running_in(lane),
            )
            if self._claiming() and limit > 0:
                if sent is None:
                    sent = time.monotonic()
                try:
                    claims = await leasing.claim(
                        self.driver, runner=self.runner, lane=lane, limit=limit, claim_id=claim_id
                    )
                except Exception as exc:
                    if (error := loops.environmental(exc)) is None:
                        raise
                    # same claim id on retry: a claim that committed is returned, not lost
                    delay = await backoff.sleep(self.shutdown_requested)
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
            self._launch(c, lane, claimed_at)
        # a lease shorter than the setting (changed meanwhile), or a retried claim's (it
        # dates from its first send), may be due before the next renewal: renew it then
        # rather than let it expire, or the self-fence stop a run that just began
        self._renew_sooner(self.executions[c.job_id] for c in claims)

    def _refill_for(self, reports: list[OutcomeReport]) -> Refill | None:
        """The claim to send with these outcomes: the room they free in the lane most of
        them ran in, and what is free there already (the outcome writer asks, per batch).
        None while the runner is not claiming."""
        if not self._claiming():
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
            running=self._running_in(lane),
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

    def _refilled(self, claims: leasing.Claims, refill: Refill) -> None:
        self._took(claims, refill.lane, refill.sent, "refill")
        if claims.taken < refill.limit:
            # the claim found the lane empty for this runner right after these jobs freed
            # their room: their ends need not wake the claim loop to look again
            self._looked_after.update(JobId(j) for j in refill.jobs)
