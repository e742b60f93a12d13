"""Which ticks a schedule fires now, under each catch-up rule, in its time zone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleetq.core.schedules import ON_TIME_S, Schedule, plan, ticks

START = datetime(2026, 3, 28, 0, 0, tzinfo=UTC)


def _schedule(catch_up: str, cron: str = "0 * * * *", zone: str = "UTC") -> Schedule:
    return Schedule(
        name="nightly",
        cron=cron,
        timezone=zone,
        commit_sha="a" * 40,
        branch=None,
        repository="/srv/git/x.git",
        catch_up=catch_up,
        last_tick=START,
    )


def test_nothing_due_before_the_first_tick() -> None:
    assert plan(_schedule("all"), START + timedelta(minutes=59)) == ([], None)


def test_all_fires_every_missed_tick_oldest_first() -> None:
    fire, skip = plan(_schedule("all"), START + timedelta(hours=3, minutes=5))
    assert fire == [START + timedelta(hours=h) for h in (1, 2, 3)] and skip is None


def test_last_fires_the_newest_and_skips_the_rest() -> None:
    fire, skip = plan(_schedule("last"), START + timedelta(hours=3, minutes=5))
    assert fire == [START + timedelta(hours=3)] and skip == START + timedelta(hours=2)


def test_none_fires_only_a_tick_that_is_on_time() -> None:
    on_time = START + timedelta(hours=3, seconds=ON_TIME_S - 1)
    assert plan(_schedule("none"), on_time) == (
        [START + timedelta(hours=3)],
        START + timedelta(hours=2),
    )
    late = START + timedelta(hours=3, seconds=ON_TIME_S + 1)
    assert plan(_schedule("none"), late) == ([], START + timedelta(hours=3))


def test_ticks_follow_the_zone_across_a_daylight_saving_change() -> None:
    """03:00 Berlin is 02:00 UTC before the change on 29 March 2026, 01:00 UTC after."""
    found = ticks("0 3 * * *", "Europe/Berlin", START, START + timedelta(days=3))
    assert [t.astimezone(UTC).hour for t in found] == [2, 1, 1]
