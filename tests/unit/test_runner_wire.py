"""The way a runner served through the API speaks (issue 46): statement values as JSON
both ways, only the runner's statements sent, and a token file that only its owner
reads."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetq.core import queries, wire
from fleetq.core.errors import (
    ConfigError,
    ConnectionFailed,
    DatabaseBusy,
    FleetqError,
    InvalidInput,
    PermissionDenied,
)
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


def _answering(status: int, body: bytes, headers: dict[str, str] | None = None) -> ApiDriver:
    def answer(_: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers=headers or {})

    return ApiDriver("http://gateway.test", "fq_x", transport=httpx.MockTransport(answer))


_FLEETQ = {"X-Fleetq-Error": "permission_denied", "Content-Type": "application/json"}
_REFUSED = b'{"error": {"type": "permission_denied", "message": "acts as node-a/r only"}}'


@pytest.mark.parametrize(
    ("status", "body", "headers", "raised", "said"),
    [
        # answers of fleetq's own: the protocol's refusal, as on a direct connection
        (403, _REFUSED, _FLEETQ, PermissionDenied, "acts as node-a/r only"),
        (400, b"{}", {"X-Fleetq-Error": "unknown_call"}, FleetqError, "HTTP 400"),
        (503, b"{}", {"X-Fleetq-Error": "database_busy"}, DatabaseBusy, "HTTP 503"),
        # anybody else's: a proxy's limit, a route an older API lacks, a rate limit, a
        # proxy's 502, a page with a 200: sent again later, never a refusal or a bug
        (413, b"<html>too large</html>", {}, ConnectionFailed, "HTTP 413"),
        (404, _REFUSED.replace(b"permission_denied", b"not_found"), {}, ConnectionFailed, "404"),
        (429, b"", {}, ConnectionFailed, "HTTP 429"),
        (502, b"bad gateway", {}, ConnectionFailed, "HTTP 502"),
        (500, b"{}", {"X-Fleetq-Error": "internal"}, ConnectionFailed, "HTTP 500"),
        (200, b"<html>welcome to the hotel wifi</html>", {}, ConnectionFailed, "HTTP 200"),
        (200, b'{"no": "rows"}', {}, ConnectionFailed, "no rows"),
        (200, b'{"rows": [{"x": {"$t": "yesterday"}}]}', {}, ConnectionFailed, "no rows"),
    ],
)
async def test_only_fleetq_answers_are_taken_for_the_protocol(
    status: int, body: bytes, headers: dict[str, str], raised: type[Exception], said: str
) -> None:
    """Issue 46's review: a proxy's 413 or 429, or an older API's route 404 ("not_found"
    in the body), were taken for the protocol's refusals: an outcome then recorded as a
    failure, a stop confirmation dropped; a page that was not JSON ended the runner as a
    bug. Only an answer of fleetq's own (its X-Fleetq-Error header) is the protocol's."""
    driver = _answering(status, body, headers)
    try:
        with pytest.raises(raised, match=said) as caught:
            await driver.fetch(queries.sql("runners_lease_seconds"))
        assert type(caught.value) is raised  # not a subclass (ConnectionFailed's)
    finally:
        await driver.close()


def test_a_value_nested_past_the_protocol_is_bad_input_not_a_crash() -> None:
    deep: object = 1
    for _ in range(900):
        deep = [deep]
    with pytest.raises(InvalidInput, match="nests deeper"):
        wire.decode(deep)
