"""The runner's side of the API: a runner token's statements, and its wake-ups.

`POST /v1/runner/calls` runs one statement a runner makes, named
(`fleetq/core/runnercalls.py`), with its arguments, in the token holder's transaction:
the protocol function it calls decides, as for a runner login, that the token's runner
acts as itself only. `GET /v1/runner/wake` long-polls the process's notices
(`notices.py`). Both refuse any token but a runner's.
"""

from __future__ import annotations

import functools
import re
from typing import Annotated, Any

from fastapi import FastAPI, Query

from fleetq.api import access, answers, batches
from fleetq.api.batches import Batches
from fleetq.api.gateway import Gateway, Token
from fleetq.api.models import Caller, RunnerCall, RunnerRows, Wake
from fleetq.api.notices import Notices
from fleetq.core import errors, queries, wire
from fleetq.core.driver import AsyncpgDriver
from fleetq.core.runnercalls import RUNNER_CALLS

WAKE_MAX_S = 25.0  # under the idle timeouts of common load balancers (60 s)


class UnknownCall(errors.InvalidInput):
    """A statement this API does not serve to runners: not a runner's, or a newer
    runner's than this API (upgrade the API first)."""


def runner_batches(gateway: Gateway, *, window_s: float = batches.WINDOW_S) -> Batches:
    """The process's batches of runners' routine calls (`batches.py`) over `gateway`."""

    async def alone(
        token: str, name: str, args: list[Any], timeout_s: float
    ) -> tuple[Caller, list[dict[str, Any]]]:
        async with gateway.acting(token) as (driver, caller):
            if caller.kind != "runner":
                raise batches.not_a_runner(caller)
            if name == batches.CHECK_ONLY:
                return caller, []
            return caller, await run_call(driver, name, args, timeout_s)

    return Batches(gateway.transaction, run_call, alone, window_s=window_s)


async def run_call(
    driver: AsyncpgDriver, name: str, args: list[Any], timeout_s: float
) -> list[dict[str, Any]]:
    """One runner statement, already acting for its token, its arguments in the wire form
    (decoded only now, once the token is known); an argument the server cannot take is
    the caller's error (400), not the API's."""
    values = [wire.decode(a) for a in args]
    try:
        return await driver.fetch(queries.sql(name), *values, timeout=timeout_s)
    except (ValueError, TypeError) as exc:  # asyncpg: arguments of the wrong type
        raise errors.InvalidInput(f"{name}: {exc}") from None
    except errors.FleetqError as exc:
        # class 22, data exception: an argument the server could not take
        if str(getattr(exc.__cause__, "sqlstate", "")).startswith("22"):
            raise errors.InvalidInput(f"{name}: {exc}") from None
        raise


def add_runner_routes(app: FastAPI, notices: Notices, runs: Batches) -> None:
    """The runner endpoints, on `app`; `runs` is the process's batches, through which
    every call goes (a routine one waits for its batch, any other runs at once)."""

    async def as_runner(
        credentials: Token, name: str, args: list[Any], timeout_s: float
    ) -> list[dict[str, Any]]:
        if credentials is None or not credentials.credentials:
            raise errors.NotAuthenticated("an API token is required: Authorization: Bearer <token>")
        token = credentials.credentials
        rows: list[dict[str, Any]] = []
        if name == batches.CHECK_ONLY and (known := runs.recently_checked(token)):
            caller = known
        elif runs.batchable(token, name, args):
            caller, rows = await runs.call(token, name, args, timeout_s)
        else:
            caller, rows = await runs.at_once(token, name, args, timeout_s)
        access.identify(caller.kind, caller.identity)
        return rows

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
        rows = await as_runner(credentials, body.name, body.args, body.timeout_s)
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
        # the token is checked (with a batch, unless a call of it was answered lately:
        # `batches.CHECKED_S`), and no connection is held while the poll waits
        await as_runner(credentials, batches.CHECK_ONLY, [], 5.0)
        return await notices.wait(after, wait_s)


@functools.cache
def _parameters(name: str) -> int:
    """How many arguments the named block takes (its highest `$n`)."""
    return max((int(n) for n in re.findall(r"\$(\d+)", queries.sql(name))), default=0)
