"""Pure input checks: what is refused, and that the refusal never echoes the input."""

from __future__ import annotations

import pytest

from fleetq.core import validation
from fleetq.core.errors import InvalidInput


def test_nul_is_found_anywhere_in_a_payload() -> None:
    with pytest.raises(InvalidInput, match="NUL"):
        validation.payload({"a": [{"b": "x\x00y"}]})
    with pytest.raises(InvalidInput, match="NUL"):
        validation.payload({"k\x00": 1})


def test_an_escaped_backslash_u0000_is_just_text() -> None:
    assert validation.payload({"doc": "write \\u0000 to mean NUL"})


def test_payload_is_canonical_compact_json() -> None:
    assert validation.payload({"b": 1, "a": [True, None]}) == '{"b":1,"a":[true,null]}'
    assert validation.payload(None) == "{}"


@pytest.mark.parametrize("value", [float("nan"), {1, 2}, object()])
def test_unserialisable_payloads_are_refused(value: object) -> None:
    with pytest.raises(InvalidInput, match="not JSON-serialisable"):
        validation.payload({"v": value})


def test_size_limit_counts_utf8_bytes_and_does_not_echo() -> None:
    with pytest.raises(InvalidInput) as caught:
        validation.payload({"s": "é" * 40}, max_bytes=50)
    assert "é" not in str(caught.value)


@pytest.mark.parametrize("name", ["", "tab\there", "x" * 300, "esc\x1b[31m"])
def test_names_are_bounded_printable_text(name: str) -> None:
    with pytest.raises(InvalidInput):
        validation.text(name, "project")
