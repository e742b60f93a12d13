"""The self-fence budget: the stop, SIGKILL included, ends before the lease can expire."""

from __future__ import annotations

import pytest

from fleetq.core.configschema import MIN_LIVENESS_SECONDS
from fleetq.runner.fencing import FenceRule


@pytest.mark.parametrize("lease", [MIN_LIVENESS_SECONDS, 6, 10, 30, 120, 3600])
def test_the_stop_ends_before_the_lease_could_expire(lease: int) -> None:
    rule = FenceRule(lease)
    assert rule.fence_after_s + rule.grace_s + rule.margin_s <= lease
    assert rule.margin_s >= 0.5  # SIGKILL, reaping and the 0.25 s check loop
    # a healthy runner renews every lease/3: two renewals may fail before it fences
    assert rule.fence_after_s >= 2 * lease / 3


def test_the_default_lease() -> None:
    rule = FenceRule(30)
    assert (rule.fence_after_s, rule.grace_s, rule.margin_s) == (22, 5, 3)
