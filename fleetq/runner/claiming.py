"""Claiming: one loop per lane, so a long `checks` job never delays a `control`
operation. A claim is sized by the lane's free slots (the database checks memory, CPUs
and capabilities in the same statement), retried with the same claim id after an error
(a claim that committed is returned, not lost), and its lease's clock starts when that
claim id was first sent (`fencing`)."""

from __future__ import annotations

import asyncio
import time
import uuid

from fleetq.core import leasing
from fleetq.core.models import RunnerState
from fleetq.runner import loops, metrics
from fleetq.runner.base import RunnerBase, log


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
            free = self.config.lanes[lane] - self._running_in(lane)
            if self._claiming() and free > 0:
                limit = min(self.config.batch, free)
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
                metrics.CLAIMS.labels(lane).inc(len(claims))
                for c in claims:
                    self._launch(c, lane, claimed_at)
                if claims and time.monotonic() - claimed_at > self._beat_s():
                    # a retried claim's lease dates from its first send: renew it now
                    # rather than let the self-fence stop a run that just began
                    self._spawn(self._heartbeat_once())
                if claims:
                    idle_wait = self.config.poll_interval_s
                if len(claims) == limit:
                    continue  # there may be more right behind
            try:
                await asyncio.wait_for(wake.wait(), idle_wait)
                idle_wait = self.config.poll_interval_s  # woken: work may be about again
            except TimeoutError:
                idle_wait = min(
                    idle_wait * 2, max(self.config.poll_max_s, self.config.poll_interval_s)
                )
