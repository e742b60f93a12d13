"""Values of a runner's statements as JSON, both ways (`fleetq-runner --api`).

A statement's arguments and rows hold what asyncpg gives and takes: numbers, text,
arrays, timestamps, UUIDs and decoded JSON. Plain JSON would turn a timestamp into text
(which asyncpg refuses for a `timestamptz` parameter) and could not tell a JSON object
from a tagged value; so a value JSON cannot say is a one-key object naming its type
(`{"$t": "2026-12-07T01:00:00+00:00"}`), and a JSON object is wrapped (`{"$o": {...}}`),
its contents left as they are. Decoding refuses anything else, so a malformed request
is bad input, never a crash.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

from fleetq.core.errors import InvalidInput

_DECODE = {
    "$t": dt.datetime.fromisoformat,
    "$date": dt.date.fromisoformat,
    "$u": uuid.UUID,
    "$d": Decimal,
    "$s": lambda seconds: dt.timedelta(seconds=float(seconds)),
    "$b": lambda text: base64.b64decode(text, validate=True),
}


def encode(value: Any) -> Any:
    """`value` as JSON that `decode` gives back."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {"$o": value}  # decoded JSON: its contents are JSON already
    if isinstance(value, dt.datetime):
        return {"$t": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, uuid.UUID):
        return {"$u": str(value)}
    if isinstance(value, Decimal):
        return {"$d": str(value)}
    if isinstance(value, dt.timedelta):
        return {"$s": value.total_seconds()}
    if isinstance(value, bytes):
        return {"$b": base64.b64encode(value).decode("ascii")}
    raise TypeError(f"no wire form for {type(value).__name__}")


MAX_DEPTH = 8  # a runner's arguments are arrays of values at most


def decode(value: Any, depth: int = 0) -> Any:
    """What `encode` made; `InvalidInput` for anything it cannot have made."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        if depth >= MAX_DEPTH:
            raise InvalidInput("a value nests deeper than the runner protocol's")
        return [decode(v, depth + 1) for v in value]
    if isinstance(value, dict) and len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "$o" and isinstance(inner, dict):
            return inner
        if tag in _DECODE and isinstance(inner, str | int | float):
            try:
                return _DECODE[tag](inner)  # type: ignore[operator]
            except (ValueError, TypeError, ArithmeticError, binascii.Error):
                raise InvalidInput(f"{tag} {str(inner)[:40]!r} is not a valid value") from None
    raise InvalidInput("a value is not in the runner protocol's wire form")
