"""`fleetq prune --before DATE`: what DATE may be (the prune itself is tested against
PostgreSQL in tests/integration/test_prune.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleetq.core import prune
from fleetq.core.errors import InvalidInput


@pytest.mark.parametrize(
    ("text", "age"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("90m", timedelta(minutes=90)),
        ("45s", timedelta(seconds=45)),
        ("2w", timedelta(weeks=2)),
        (" 7 d ", timedelta(days=7)),
    ],
)
def test_an_age_is_counted_back_from_the_database_s_clock(text: str, age: timedelta) -> None:
    assert prune.parse_before(text) == age


@pytest.mark.parametrize(
    "text", ["2024-05-01T10:00:00Z", "2024-05-01T12:00:00+02:00", "2024-05-01 10:00:00+00:00"]
)
def test_a_timestamp_with_a_zone_is_that_moment(text: str) -> None:
    assert prune.parse_before(text) == datetime(2024, 5, 1, 10, tzinfo=UTC)


def test_a_date_or_a_timestamp_without_a_zone_is_local_time() -> None:
    moment = prune.parse_before("2024-05-01")
    assert isinstance(moment, datetime) and moment.tzinfo is not None
    assert moment == datetime(2024, 5, 1).astimezone()


@pytest.mark.parametrize("text", ["", "tomorrow", "30", "-3d", "3 days", "1y", "2024-13-01"])
def test_anything_else_is_refused_naming_what_is_taken(text: str) -> None:
    with pytest.raises(InvalidInput, match=r"DATE must be an ISO date .* or an age \(30d"):
        prune.parse_before(text)
