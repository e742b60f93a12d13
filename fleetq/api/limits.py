"""Request size limits, as pure ASGI: a body over the limit is refused with 413 before
the application reads it (by its Content-Length), or as soon as a streamed body passes
the limit, so no request can make the server buffer more than `max_bytes`.

A runner's calls (`/v1/runner/`) have a limit of their own, `RUNNER_MAX_BYTES`: its
outcome writer sends up to 256 outcomes in one statement, each with a log tail of up to
4 KiB, which JSON may write six bytes a byte (`\u0001`): 6.3 MiB. At the producers'
limit (256 KiB) such a batch was refused again at every retry, and its jobs' leases ran
out."""

from __future__ import annotations

import json
import re

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class _TooLarge(HTTPException):
    """Raised while the app reads the body: FastAPI passes an HTTPException on (any
    other error there becomes its 400 "error parsing the body"), and the app's handler
    answers it as 413."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"the request body is over the limit of {max_bytes} bytes")


RUNNER_PATHS = "/v1/runner/"
RUNNER_MAX_BYTES = 16 * 1024 * 1024
_BEARER = re.compile(rb"Bearer fq_[A-Za-z0-9_-]{20,100}")


class BodyLimit:
    def __init__(
        self, app: ASGIApp, max_bytes: int, runner_max_bytes: int = RUNNER_MAX_BYTES
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.runner_max_bytes = runner_max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        # the runners' limit for what looks like a runner's call: a runner path and a
        # token of fleetq's shape (an anonymous 16-MiB body held the API for seconds)
        runner = str(scope.get("path", "")).startswith(RUNNER_PATHS) and bool(
            _BEARER.fullmatch(headers.get(b"authorization", b""))
        )
        limit = self.runner_max_bytes if runner else self.max_bytes
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await self._refuse(send, limit)
            return
        received = 0
        started = False

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge(limit)
            return message

        async def watching(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, watching)
        except _TooLarge:
            if not started:
                await self._refuse(send, limit)

    async def _refuse(self, send: Send, limit: int) -> None:
        body = json.dumps(
            {
                "error": {
                    "type": "request_too_large",
                    "message": f"the request body is over the limit of {limit} bytes",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
