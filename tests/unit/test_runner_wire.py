"""The way a runner served through the API speaks (issue 46): statement values as JSON
both ways, only the runner's statements sent, and a token file that only its owner
reads."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetq.core import queries, wire
from fleetq.core.errors import ConfigError, InvalidInput
from fleetq.core.runnercalls import RUNNER_CALLS
from fleetq.runner.remote import ApiDriver, read_token

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.datetimes(timezones=st.just(dt.UTC))
    | st.uuids()
    | st.dictionaries(st.text(), _json, max_size=3),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=10,
)


@given(_values)
def test_every_value_comes_back_as_it_went(value: object) -> None:
    assert wire.decode(wire.encode(value)) == value


def test_a_json_object_that_looks_like_a_tag_stays_an_object() -> None:
    value = {"$t": "2026-12-07T01:00:00+00:00"}
    assert wire.decode(wire.encode(value)) == value
    assert wire.decode(wire.encode(Decimal("1.5"))) == Decimal("1.5")
    assert wire.decode(wire.encode(dt.timedelta(seconds=3))) == dt.timedelta(seconds=3)


@pytest.mark.parametrize(
    "sent",
    [{"x": 1}, {"$t": "yesterday"}, {"$u": "not-a-uuid"}, {"$b": "!!"}, {"$t": [1]}, {}],
)
def test_what_encode_cannot_have_made_is_bad_input(sent: object) -> None:
    with pytest.raises(InvalidInput):
        wire.decode(sent)


def test_every_runner_call_names_a_block() -> None:
    known = set(queries.names())
    assert known >= RUNNER_CALLS, sorted(RUNNER_CALLS - known)
    # session-bound: never through a gateway
    assert not RUNNER_CALLS & {"runners_take_identity", "lease_lock_for_handler"}


async def test_a_statement_a_runner_does_not_make_is_never_sent() -> None:
    driver = ApiDriver("http://127.0.0.1:9", "fq_x")  # nothing listens: nothing is sent
    try:
        with pytest.raises(RuntimeError, match="runners_list is not a runner call"):
            await driver.fetch(queries.sql("runners_list"))
        with pytest.raises(RuntimeError, match="not a named block"):
            await driver.fetch("SELECT 1")
    finally:
        await driver.close()


def test_a_token_file_others_may_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.token"
    path.write_text("fq_secret\n")
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_token(path)
    path.chmod(0o600)
    assert read_token(path) == "fq_secret"
    path.write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        read_token(path)
    with pytest.raises(ConfigError, match="cannot read"):
        read_token(tmp_path / "missing.token")


def test_uuid_round_trip_keeps_its_type() -> None:
    value = uuid.uuid4()
    assert isinstance(wire.decode(wire.encode(value)), uuid.UUID)
