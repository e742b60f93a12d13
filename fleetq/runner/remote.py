"""A runner served through `fleetq api` (`fleetq-runner --api URL --token-file F`): the
same runner, on a node with no database credentials.

Two pieces stand in for what a runner with a DSN has: `ApiDriver`, the `Driver` every
part of the runner already speaks, sends each statement's name and arguments (never SQL)
to `POST /v1/runner/calls` (`fleetq/api/runners.py`), where the protocol function it
names decides what the token's runner may do, as for a runner login; and `ApiWakes`
follows the gateway's LISTEN connection by long poll, in place of a LISTEN session of
its own. Fencing, reconciliation, adoption and the self-fence are the runner's own code,
unchanged: a reply lost after the gateway committed is retried and answered `already`,
as on a direct connection.

What needs a database session stays with a DSN: the launch gate (a transaction across
the process spawn; here the start report's own fence stops a run the database no longer
wants, as the gate's docstring says) and a handler's `ctx.transaction()`.
"""

from __future__ import annotations

import logging
import ssl
import stat
from pathlib import Path
from typing import Any, LiteralString

import httpx

from fleetq import __version__
from fleetq.core import errors, queries, wire
from fleetq.core.driver import DEFAULT_TIMEOUT_S
from fleetq.core.runnercalls import ERROR_HEADER, RUNNER_CALLS

log = logging.getLogger("fleetq.runner.service")
# httpx says every request at INFO: a runner makes several a second, and its log is for
# what happened to jobs (a failed call is said by whoever made it)
logging.getLogger("httpx").setLevel(logging.WARNING)

WAKE_WAIT_S = 25.0  # the gateway's longest; a reply this long is not a lost connection
_MARGIN_S = 5.0  # what a request may take beyond its statement's own timeout
KEEPALIVE_S = 2.0  # under `fleetq api`'s keep-alive timeout (and any load balancer's)

# the API's error types (snake case of the class names) a runner acts on
_BY_TYPE: dict[str, type[errors.FleetqError]] = {
    "connection_failed": errors.ConnectionFailed,
    "read_only_server": errors.ReadOnlyServer,
    "query_timeout": errors.QueryTimeout,
    "database_busy": errors.DatabaseBusy,
    "not_authenticated": errors.NotAuthenticated,
    "permission_denied": errors.PermissionDenied,
    "not_allowed": errors.NotAllowed,
    "not_found": errors.NotFound,
    "capacity_conflict": errors.CapacityConflict,
    "refused_now": errors.RefusedNow,
    "invalid_input": errors.InvalidInput,
}


def read_token(path: Path) -> str:
    """The runner token in `path` (`fleetq tokens add runner NODE/NAME`), refused when
    others may read the file: a token is a credential."""
    try:
        mode = path.stat().st_mode
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise errors.ConfigError(f"cannot read the token file {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise errors.ConfigError(
            f"the token file {path} may be read by others (mode {stat.S_IMODE(mode):o}): "
            f"chmod 600 {path}"
        )
    if not token:
        raise errors.ConfigError(f"the token file {path} is empty")
    return token


class ApiDriver:
    """The runner's statements, by name, through the API, as its token's runner."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        ca_file: Path | None = None,
        transport: httpx.AsyncBaseTransport | None = None,  # tests: answers of their own
    ) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.AsyncClient(
            base_url=self.url,
            headers={
                "Authorization": f"Bearer {token}",
                "User-Agent": f"fleetq-runner/{__version__}",
            },
            verify=ssl.create_default_context(cafile=ca_file) if ca_file is not None else True,
            # connections to one gateway: a pool's worth, as a direct runner has. An idle
            # one is dropped before the API's keep-alive timeout (5 s) ends it: a request
            # sent on a connection the server was closing failed with ReadError
            limits=httpx.Limits(
                max_connections=32, max_keepalive_connections=8, keepalive_expiry=KEEPALIVE_S
            ),
            transport=transport,
        )

    async def fetch(
        self, query: LiteralString, *args: object, timeout: float = DEFAULT_TIMEOUT_S
    ) -> list[dict[str, Any]]:
        name = queries.name_of(query)
        if name not in RUNNER_CALLS:
            # a bug: the runner made a statement the API does not serve to runners
            raise RuntimeError(f"statement {name or '(not a named block)'} is not a runner call")
        body = {"name": name, "args": [wire.encode(a) for a in args], "timeout_s": timeout}
        answer = await self._send("POST", "/v1/runner/calls", timeout + _MARGIN_S, json=body)
        rows = answer.get("rows")
        try:
            assert isinstance(rows, list)
            return [{str(k): wire.decode(v) for k, v in row.items()} for row in rows]
        except (AssertionError, AttributeError, errors.InvalidInput):
            # not the API's answer (a proxy's page, a mangled reply): sent again later
            raise errors.ConnectionFailed(
                f"the gateway {self.url} answered {name} with no rows"
            ) from None

    async def wake(self, after: str | None, wait_s: float = WAKE_WAIT_S) -> dict[str, Any]:
        """The gateway's notices after `after` (long poll: up to `wait_s`)."""
        params: dict[str, str | float] = {"wait_s": wait_s}
        if after is not None:
            params["after"] = after
        return await self._send("GET", "/v1/runner/wake", wait_s + _MARGIN_S, params=params)

    async def close(self) -> None:
        await self._client.aclose()

    async def _send(self, method: str, path: str, timeout: float, **kw: Any) -> dict[str, Any]:
        try:
            reply = await self._client.request(method, path, timeout=timeout, **kw)
        except httpx.TimeoutException:
            raise errors.QueryTimeout(
                f"the gateway {self.url} did not answer within {timeout:.0f}s"
            ) from None
        except httpx.TransportError as exc:
            if (untrusted := _untrusted(exc)) is not None:
                # asking again will not help: a configuration error, said at start-up
                raise errors.ConfigError(
                    f"the gateway {self.url} is not trusted ({untrusted.verify_message}): "
                    "give the CA that signed its certificate with --api-ca"
                ) from None
            raise errors.ConnectionFailed(
                f"cannot reach the gateway {self.url}: {str(exc) or type(exc).__name__}"
            ) from None
        try:
            body: Any = reply.json()
        except ValueError:
            body = None
        if reply.is_success and isinstance(body, dict):
            return body
        error = body.get("error") if isinstance(body, dict) else None
        message = str(error.get("message", "")) if isinstance(error, dict) else ""
        said = f"HTTP {reply.status_code}" + (f": {message}" if message else "")
        kind = reply.headers.get(ERROR_HEADER)
        cls = _BY_TYPE.get(kind or "")
        transient = cls is not None and issubclass(cls, _TRANSIENT)
        if kind is None or (reply.status_code >= 500 and not transient):
            # not an answer of fleetq's own (a proxy's 413 or 502, a route an older API
            # lacks, a captive portal's page) or a gateway's bug: never taken for the
            # protocol's refusal; the call is made again, as after a lost connection
            raise errors.ConnectionFailed(f"the gateway {self.url} answered {said}")
        if cls is None:  # fleetq's, of no kind the runner acts on (unknown_call, ...)
            raise errors.FleetqError(f"the gateway {self.url} answered {said}")
        raise cls(message or said)


_TRANSIENT = (errors.ConnectionFailed, errors.DatabaseBusy)  # as loops.transient says


def _untrusted(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate check that failed under `exc` (httpx wraps it twice), if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
