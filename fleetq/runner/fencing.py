"""The self-fence rule: when a runner that cannot renew a lease must stop the job itself.

Why: the database may expire a lease `lease` seconds after the renewal that set it, and
another runner may then claim the job at once. A runner that cannot renew (the database
or the network is gone) must therefore have *finished* stopping its run, SIGKILL
included, before that moment, or two executions of one job overlap.

The clock: the runner's monotonic clock, started when the renewal (or the claim) was
*sent*. The database computes the expiry from its own clock when it runs the statement,
which is after the send, so the expiry is never earlier than `sent + lease`. A retried
claim returns the lease its first attempt committed, so its clock starts at the first
send, not when a reply finally arrives.

The budget, counted back from `sent + lease`:
- `margin_s` for SIGKILL to take effect and the process group to be reaped, and for the
  runner's own scheduling (a 0.25 s check loop): max(0.5 s, lease/10);
- `grace_s` between SIGTERM and SIGKILL: min(5 s, lease/6), shorter than the grace of an
  ordinary stop, since a job that ignores SIGTERM must not outlive the lease;
- fencing starts at `lease - margin - grace` after the send: 22 s for a 30 s lease,
  2 s for the shortest lease fleetq accepts (3 s), still two renewals (lease/3) away.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetq.runner.executor import STOP_GRACE_S

SELF_FENCE_CHECK_S = 0.25


@dataclass(frozen=True)
class FenceRule:
    """The self-fence budget for one lease length."""

    lease_s: float

    @property
    def grace_s(self) -> float:
        """SIGTERM to SIGKILL when fencing."""
        return min(STOP_GRACE_S, self.lease_s / 6)

    @property
    def margin_s(self) -> float:
        """What SIGKILL, reaping and scheduling may take."""
        return max(0.5, self.lease_s / 10)

    @property
    def fence_after_s(self) -> float:
        """Seconds after the last renewal was sent when the runner starts stopping."""
        return self.lease_s - self.margin_s - self.grace_s

    def due(self, renewed_at: float, now: float) -> bool:
        """Whether a run whose lease was last renewed (sent) at `renewed_at` must stop."""
        return now - renewed_at > self.fence_after_s
