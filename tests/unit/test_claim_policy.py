"""The claim policy the runner and the bench's simulated runner share (`runner.policy`)."""

from __future__ import annotations

from fleetq.runner import policy


def test_a_claim_asks_for_the_free_slots_at_most_a_batch() -> None:
    assert policy.claim_limit(batch=8, slots=4, running=1) == 3
    assert policy.claim_limit(batch=2, slots=4, running=1) == 2
    assert policy.claim_limit(batch=8, slots=4, running=4) == 0
    assert policy.claim_limit(batch=8, slots=2, running=3) < 1  # the setting shrank


def test_only_a_full_claim_claims_again_at_once() -> None:
    assert policy.more_behind(taken=3, limit=3)
    assert not policy.more_behind(taken=2, limit=3)


def test_idle_polls_double_up_to_the_ceiling_never_below_the_interval() -> None:
    assert policy.next_wait(1.0, poll_s=1.0, poll_max_s=5.0) == 2.0
    assert policy.next_wait(4.0, poll_s=1.0, poll_max_s=5.0) == 5.0
    assert policy.next_wait(1.0, poll_s=1.0, poll_max_s=0.5) == 1.0


def test_a_refill_takes_the_lane_most_outcomes_ran_in() -> None:
    assert policy.refill_lane({}) is None
    assert policy.refill_lane({1: "a", 2: "b", 3: "b"}) == ("b", [2, 3])
    assert policy.refill_limit(batch=8, slots=4, running=4, freed=2) == 2
    assert policy.refill_limit(batch=1, slots=4, running=4, freed=2) == 1
    assert policy.refill_limit(batch=8, slots=2, running=4, freed=1) < 1


def test_the_beat_serves_the_lease_and_the_offline_threshold_alike() -> None:
    assert policy.beat_s(30, 30) == 10
    assert policy.beat_s(30, 9) == 3
    assert policy.beat_s(0.3, 30) == policy.MIN_BEAT_S
