"""The access log: one line per request on the API's logger, at INFO:

    POST /v1/jobs 201 4.2 ms submitter:ci-bot

(method, path, status, duration, and the identity the request acted for: `-` when no
token resolved). Never the token, the Authorization header, the query or the body: the
path is the only part of a request a line quotes, escaped so it cannot start a line or
move a terminal's cursor.

Pure ASGI, outside every other layer but Starlette's last-resort error handler, so a
body refused for its size (413) has its line too, and a request that raised is logged
as the 500 that handler answers.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleetq.api.limits import RUNNER_PATHS
from fleetq.core.text import escape


@dataclasses.dataclass
class _Request:
    identity: str = "-"


# The request being served, shared by reference: what an endpoint records reaches the
# line even where the framework runs the endpoint in a copy of the context.
_serving: contextvars.ContextVar[_Request | None] = contextvars.ContextVar(
    "fleetq_api_request", default=None
)


def identify(kind: str, identity: str | None) -> None:
    """Name who the current request acts for, as `kind:identity` (e.g. `submitter:ci`)."""
    request = _serving.get()
    if request is not None:
        request.identity = escape(f"{kind}:{identity}" if identity else kind)


class AccessLog:
    def __init__(self, app: ASGIApp, logger: logging.Logger) -> None:
        self.app = app
        self.log = logger

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = _Request()
        reset = _serving.set(request)
        started = time.perf_counter()
        status = 500  # what Starlette answers when the application raised

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            _serving.reset(reset)
            path = str(scope.get("path", ""))
            # a fleet's runners call many times a second: their calls that went well are
            # logged at DEBUG (`fleetq api -v`), a refusal or a failure as every request
            quiet = path.startswith(RUNNER_PATHS) and status < 400
            self.log.log(
                logging.DEBUG if quiet else logging.INFO,
                "%s %s %d %.1f ms %s",
                escape(scope.get("method", "")),
                escape(scope.get("path", "")),
                status,
                (time.perf_counter() - started) * 1000,
                request.identity,
            )
