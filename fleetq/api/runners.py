"""The runner's side of the API: a runner token's statements, and its wake-ups.

`POST /v1/runner/calls` runs one statement a runner makes, named
(`fleetq/core/runnercalls.py`), with its arguments, in the token holder's transaction:
the protocol function it calls decides, as for a runner login, that the token's runner
acts as itself only. `GET /v1/runner/wake` long-polls the process's notices
(`notices.py`). Both refuse any token but a runner's.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import FastAPI, Query

from fleetq.api import answers
from fleetq.api.gateway import Token
from fleetq.api.models import RunnerCall, RunnerRows, Wake
from fleetq.api.notices import Notices
from fleetq.core import errors, queries, wire
from fleetq.core.driver import AsyncpgDriver
from fleetq.core.runnercalls import RUNNER_CALLS

WAKE_MAX_S = 25.0  # under the idle timeouts of common load balancers (60 s)


class UnknownCall(errors.InvalidInput):
    """A statement this API does not serve to runners: not a runner's, or a newer
    runner's than this API (upgrade the API first)."""


Acting = Callable[[Any], contextlib.AbstractAsyncContextManager[Any]]


def add_runner_routes(app: FastAPI, notices: Notices, acting: Acting) -> None:
    """The runner endpoints, on `app`; `acting` is the app's own (the access log names
    the token's holder)."""

    @contextlib.asynccontextmanager
    async def as_runner(credentials: Token) -> AsyncIterator[AsyncpgDriver]:
        async with acting(credentials) as (driver, caller):
            if caller.kind != "runner":
                raise errors.PermissionDenied(
                    f"the API token of {caller.identity} (a {caller.kind} token) is not a "
                    "runner's: the runner endpoints serve runner tokens only"
                )
            yield driver

    @app.post(
        "/v1/runner/calls",
        response_model=RunnerRows,
        responses=answers.errors(
            401,
            413,
            503,
            s400="not a statement a runner makes, or an argument it cannot take",
            s403="not a runner token, or a runner acting as another",
        ),
        summary="One statement of a runner's (fleetq-runner --api)",
    )
    async def call(body: RunnerCall, credentials: Token) -> RunnerRows:
        """Run the named statement for the token's runner; its rows in the wire form."""
        if body.name not in RUNNER_CALLS:
            raise UnknownCall(
                f"{body.name!r} is not a statement a runner makes through this API "
                "(a runner newer than the API? upgrade the API first)"
            )
        if len(body.args) != _parameters(body.name):
            raise errors.InvalidInput(
                f"{body.name} takes {_parameters(body.name)} argument(s), not {len(body.args)}"
            )
        async with as_runner(credentials) as driver:
            args = [wire.decode(a) for a in body.args]  # after the token is known
            try:
                rows = await driver.fetch(queries.sql(body.name), *args, timeout=body.timeout_s)
            except (ValueError, TypeError) as exc:  # asyncpg: arguments of the wrong type
                raise errors.InvalidInput(f"{body.name}: {exc}") from None
            except errors.FleetqError as exc:
                # class 22, data exception: an argument the server could not take
                if str(getattr(exc.__cause__, "sqlstate", "")).startswith("22"):
                    raise errors.InvalidInput(f"{body.name}: {exc}") from None
                raise
        return RunnerRows(rows=[{k: wire.encode(v) for k, v in r.items()} for r in rows])

    @app.get(
        "/v1/runner/wake",
        response_model=Wake,
        responses=answers.errors(400, 401, 503, s403="not a runner token"),
        summary="Wake-ups for a runner (long poll)",
    )
    async def wake(
        credentials: Token,
        after: Annotated[str | None, Query(max_length=64)] = None,
        wait_s: Annotated[float, Query(ge=0, le=WAKE_MAX_S)] = WAKE_MAX_S,
    ) -> Wake:
        """The notices heard after `after` (a cursor this answers), waiting up to `wait_s`
        for one; `gap` when some may have been missed."""
        async with as_runner(credentials):
            pass  # the token is checked, and the transaction ends before the wait
        return await notices.wait(after, wait_s)


@functools.cache
def _parameters(name: str) -> int:
    """How many arguments the named block takes (its highest `$n`)."""
    return max((int(n) for n in re.findall(r"\$(\d+)", queries.sql(name))), default=0)
