"""Input checks that run before anything reaches SQL.

Why here and not only in the database: a bad request should be refused with a message
that names the field, without a round trip, and without ever echoing what was sent (a
payload may hold secrets; a name may hold terminal escapes). The database functions
check again, so other clients are held to the same rules.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fleetq.core.errors import InvalidInput

MAX_NAME_BYTES = 256
_SHA = re.compile(r"[0-9a-f]{40}")


def commit_sha(value: str) -> str:
    """A full 40-hex commit SHA, lower-cased. Short SHAs, refs and option-shaped strings
    are refused: a job checks an exact commit, never whatever a name points to now."""
    text(value, "commit")
    if value.startswith("-"):
        raise InvalidInput("commit looks like a command-line option; give a full 40-hex SHA")
    lowered = value.lower()
    if not _SHA.fullmatch(lowered):
        raise InvalidInput(
            f"commit must be a full 40-character hex SHA (got {len(value)} characters"
            + (", not all hex)" if len(value) == 40 else ")")
        )
    return lowered


def text(value: str, field: str, *, max_bytes: int = MAX_NAME_BYTES) -> str:
    """A non-empty name: valid UTF-8, no NUL, no control characters, bounded size."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{field} must be a non-empty string")
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{field} is not valid UTF-8") from None
    if len(encoded) > max_bytes:
        raise InvalidInput(f"{field} is {len(encoded)} bytes, over the limit of {max_bytes}")
    if any(ord(ch) < 32 or 127 <= ord(ch) <= 159 for ch in value):
        raise InvalidInput(f"{field} contains NUL or control characters")
    return value


def reason(value: str, *, max_bytes: int = 1000) -> str:
    """Why an operator acted (a cancel's reason): free text, possibly empty, but no NUL
    (PostgreSQL text cannot hold it) and bounded."""
    if not isinstance(value, str):
        raise InvalidInput("reason must be a string")
    if "\x00" in value:
        raise InvalidInput("reason contains a NUL character")
    if len(value.encode("utf-8", "replace")) > max_bytes:
        raise InvalidInput(f"reason is over the limit of {max_bytes} bytes")
    return value


def optional_text(value: str | None, field: str) -> str | None:
    """`text`, or None."""
    return None if value is None else text(value, field)


MAX_DEPENDENCIES = 100
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


def traceparent(value: str | None) -> str | None:
    """A W3C trace context header (version-traceid-parentid-flags), or None. Refused as
    the standard says a receiver must: version ff, or an all-zero trace or parent id."""
    if value is None:
        return None
    match = _TRACEPARENT.fullmatch(value.strip().lower()) if isinstance(value, str) else None
    if match is None:
        raise InvalidInput(
            "traceparent must be a W3C trace context: 00-<32 hex trace id>-<16 hex parent id>-"
            "<2 hex flags>"
        )
    version, trace, parent, _flags = match.groups()
    if version == "ff" or set(trace) == {"0"} or set(parent) == {"0"}:
        raise InvalidInput("traceparent has version ff or an all-zero trace or parent id")
    return match.group(0)


def job_ids(value: list[int] | None, field: str) -> list[int] | None:
    """Job ids (positive, at most MAX_DEPENDENCIES, duplicates dropped), or None."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidInput(f"{field} takes a list of job ids")
    if not value:
        return None
    if len(value) > MAX_DEPENDENCIES:
        raise InvalidInput(f"{field} names {len(value)} jobs, over the limit of {MAX_DEPENDENCIES}")
    ids = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 < item < 2**63:
            raise InvalidInput(f"{field} takes job ids (whole numbers from 1 to 2^63-1)")
        ids.append(item)
    return sorted(set(ids))


def payload(value: dict[str, Any] | None, *, max_bytes: int | None = None) -> str:
    """The payload as JSON text: an object, no NUL anywhere (PostgreSQL's jsonb cannot
    store U+0000), within `max_bytes` when given. A submit leaves the size to the
    database, whose limit is a setting (`max_payload_bytes`): a fixed one here refused
    payloads a raised setting allows. The size is counted as the database counts it,
    its jsonb text (`, ` and `: ` separators), so the two never disagree."""
    if value is None:
        return "{}"
    if not isinstance(value, dict):
        raise InvalidInput("payload must be a JSON object")
    try:
        encoded = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        has_nul = _has_nul(value)
    except RecursionError:
        raise InvalidInput("payload nests too deeply to be read") from None
    except (TypeError, ValueError):
        raise InvalidInput("payload is not JSON-serialisable") from None
    if has_nul:
        raise InvalidInput("payload contains a NUL character")
    try:
        size = len(json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput("payload is not valid UTF-8") from None
    if max_bytes is not None and size > max_bytes:
        raise InvalidInput(f"payload is {size} bytes, over the limit of {max_bytes}")
    return encoded


def _has_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False
