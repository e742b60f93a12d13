"""The error answers an operation documents in /openapi.json: each status with the words
a client reads (tests/integration/test_api.py drives every one)."""

from __future__ import annotations

from typing import Any

from fleetq.api.models import ErrorBody

ERROR_TEXT = {
    400: "the request is malformed (the CLI's message says which field)",
    401: "no token, or an unknown or revoked one",
    403: "the token's holder may not do this",
    404: "no such job",
    409: "the idempotency key names a different request",
    413: "the request body is over the server's --max-body",
    503: "the database is unreachable or busy: retry",
}


def errors(*codes: int, **said: str) -> dict[int | str, dict[str, Any]]:
    """The error answers of an operation, each `ErrorBody`: `codes` with their usual
    words, `said` (`s422="..."`) with words of the operation's own."""
    texts = {code: ERROR_TEXT[code] for code in codes}
    texts.update({int(key.removeprefix("s")): text for key, text in said.items()})
    return {code: {"model": ErrorBody, "description": text} for code, text in texts.items()}
