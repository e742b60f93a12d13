"""The HTTP producer API: submit (idempotent by key), a job's status, a commit's result,
cancel, whoami and health, as JSON with an OpenAPI document (/openapi.json).

Every call but health acts for its bearer token (`fleetq tokens`), in one transaction,
through the same core functions the CLI calls: the same validation, the same messages,
and the protocol's own checks of who may do what. Errors answer
`{"error": {"type", "message"}}` with the status a client can act on (400 bad input,
401 no valid token, 403 not allowed, 404 no such job, 409 a conflicting key, 422 an
unknown project or operation, 503 database unreachable or busy: retry). The document
lists, per operation, exactly the statuses it answers (tests/integration/test_api.py
drives each one), and each request has one line in the access log (fleetq/api/access.py).

No /docs or /redoc: FastAPI's pages load Swagger UI and ReDoc from a CDN, so they are
blank offline and run a third party's script on the API's origin; no maintained package
among fleetq's dependencies ships those assets, and vendoring megabytes of JavaScript is
not this repository's to keep up to date. /openapi.json is the schema: any OpenAPI
viewer or client generator reads it.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from fleetq import __version__
from fleetq.api import access
from fleetq.api.answers import errors as _errors
from fleetq.api.batches import WINDOW_S
from fleetq.api.gateway import Gateway, job_path, savepoint
from fleetq.api.limits import RUNNER_MAX_BYTES, BodyLimit
from fleetq.api.models import (
    COMMIT_PATTERN,
    Caller,
    CancelRequest,
    CommitResult,
    ErrorBody,
    Health,
    SubmitRequest,
    Submitted,
)
from fleetq.api.notices import Notices
from fleetq.api.runners import add_runner_routes, runner_batches
from fleetq.core import eligibility, errors, producer, readers, validation
from fleetq.core.driver import AsyncpgDriver
from fleetq.core.models import CancelResult, Job, JobId, decision
from fleetq.core.runnercalls import ERROR_HEADER

log = logging.getLogger("fleetq.api")

DEFAULT_MAX_BODY = 256 * 1024  # a payload's default limit is 64 KiB (settings)
BIGINT_MAX = 2**63 - 1

_STATUS: list[tuple[type[errors.FleetqError], int]] = [
    (errors.NotAuthenticated, 401),
    (errors.PermissionDenied, 403),
    (errors.InvalidInput, 400),
    (errors.NotAllowed, 422),
    (errors.NotFound, 404),
    (errors.IdempotencyConflict, 409),
    (errors.RefusedNow, 409),
    (errors.CapacityConflict, 409),
    (errors.ConnectionFailed, 503),
    (errors.DatabaseBusy, 503),
    (errors.SchemaOutOfDate, 503),
]
_HTTP_TYPES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}

_bearer = HTTPBearer(auto_error=False, description="a token from `fleetq tokens add`")
Token = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
JobPath = Annotated[int, Path(ge=1, le=BIGINT_MAX, description="the job's id")]
CommitPath = Annotated[
    str,
    Path(
        description="the full 40-hex commit SHA (any case)",
        json_schema_extra={"pattern": COMMIT_PATTERN},
    ),
]


def create_app(
    gateway: Gateway,
    *,
    max_body: int = DEFAULT_MAX_BODY,
    max_runner_body: int = RUNNER_MAX_BYTES,
    batch_window_s: float = WINDOW_S,
) -> FastAPI:
    """The application over `gateway`, which it opens at start and closes at the end."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gateway.open()
        notices.start()
        try:
            yield
        finally:
            await runs.close()
            await notices.close()
            await gateway.close()

    notices = Notices(gateway.session_dsn)
    runs = runner_batches(gateway, window_s=batch_window_s)

    app = FastAPI(
        title="fleetq",
        version=__version__,
        summary="Submit jobs to a fleetq queue and read their results.",
        lifespan=lifespan,
        docs_url=None,  # Swagger UI and ReDoc come from a CDN: see the module's docstring
        redoc_url=None,
    )
    app.add_middleware(BodyLimit, max_bytes=max_body, runner_max_bytes=max_runner_body)
    app.add_middleware(access.AccessLog, logger=log)  # added last: outside the body limit
    app.openapi = _documented(app)  # type: ignore[method-assign]
    _handle_errors(app)

    @contextlib.asynccontextmanager
    async def acting(
        token: HTTPAuthorizationCredentials | None,
    ) -> AsyncIterator[tuple[AsyncpgDriver, Caller]]:
        """`gateway.acting` for the request's token; the access log names its holder."""
        async with gateway.acting(_secret(token)) as (driver, caller):
            access.identify(caller.kind, caller.identity)
            yield driver, caller

    async def never_runnable(driver: AsyncpgDriver, job_id: JobId) -> list[str]:
        """The CLI's warning when no registered runner could ever run the job; a failure
        here never undoes the submit (a savepoint of its own)."""
        try:
            async with savepoint(driver):
                warning = await eligibility.never_runnable(driver, job_id)
        except errors.FleetqError:
            return []
        return [warning] if warning is not None else []

    @app.post(
        "/v1/jobs",
        status_code=201,
        response_model=Submitted,
        responses={
            200: {"model": Submitted, "description": "the idempotency key's existing job"},
            **_errors(
                400,
                401,
                403,
                409,
                413,
                503,
                s422="unknown project or operation, or an `after` job not found",
            ),
        },
        summary="Submit a job",
    )
    async def submit(
        body: SubmitRequest,
        request: Request,
        response: Response,
        token: Token,
        idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
        traceparent: Annotated[str | None, Header()] = None,
    ) -> Submitted:
        """Submit PROJECT OPERATION at an exact commit, as the token's identity (which
        sets the priority class). With an idempotency key, a repeat answers 200 with the
        job it already made. A W3C `traceparent` header is stored and handed to the job;
        a malformed one is ignored (as the standard asks) and said so in `warnings`, as
        is a job no registered runner could ever run. The same key with another request
        (project, operation, commit, node, task, payload or `after`) is a 409."""
        key = body.idempotency_key
        if idempotency_key is not None:
            # a header is read as latin-1: the same key sent as UTF-8 bytes would name
            # another job than in the body, so a header key is ASCII, and only one
            if len(request.headers.getlist("idempotency-key")) > 1:
                raise errors.InvalidInput("give one Idempotency-Key header")
            if not idempotency_key.isascii():
                raise errors.InvalidInput(
                    "the Idempotency-Key header must be ASCII (send other keys in the body)"
                )
        if idempotency_key is not None and key is not None and key != idempotency_key:
            raise errors.InvalidInput("the Idempotency-Key header and idempotency_key differ")
        warnings: list[str] = []
        trace = None
        if traceparent:
            try:
                trace = validation.traceparent(traceparent)
            except errors.InvalidInput as exc:
                warnings.append(f"ignored the traceparent header: {exc}")
        async with acting(token) as (driver, caller):
            answer = await producer.submit(
                driver,
                project=body.project,
                operation=body.operation,
                commit=body.commit,
                submitted_by=caller.identity or "api",
                requested_node=body.node,
                idempotency_key=key if key is not None else idempotency_key,
                task_id=body.task,
                payload=body.payload,
                after=body.after,
                traceparent=trace,
            )
            if answer.created:
                warnings += await never_runnable(driver, answer.job_id)
        location = job_path(answer.job_id)
        response.headers["Location"] = location
        if not answer.created:
            response.status_code = 200
        return Submitted(**answer.model_dump(), location=location, warnings=warnings)

    @app.get(
        "/v1/jobs/{job_id}",
        response_model=Job,
        responses=_errors(400, 401, 404, 503),
        summary="A job's state",
    )
    async def job(job_id: JobPath, token: Token) -> Job:
        """The job as `fleetq jobs --json` shows it: state, lease, budgets (attempts,
        lost, reassigned), what it waits on, its trace context. Every token reads every
        job (a submitter's too: what it may not do is cancel another's)."""
        async with acting(token) as (driver, _):
            return await readers.job(driver, JobId(job_id))

    @app.post(
        "/v1/jobs/{job_id}/cancel",
        response_model=CancelResult,
        responses=_errors(400, 401, 403, 404, 413, 503),
        summary="Cancel a job",
    )
    async def cancel(
        job_id: JobPath, token: Token, body: CancelRequest | None = None
    ) -> CancelResult:
        """Terminal at once; a running job shows stop pending until its runner confirms
        the stop. A submitter's token cancels only its own jobs; cancelling a finished
        job changes nothing; a job that does not exist is 404, as its read is (every
        token reads every job, so this tells a submitter nothing new)."""
        async with acting(token) as (driver, caller):
            await readers.job(driver, JobId(job_id))  # NotFound: 404, before "not yours"
            return await producer.cancel(
                driver,
                job_id=JobId(job_id),
                actor=caller.identity or "api",
                reason=(body or CancelRequest()).reason,
            )

    @app.get(
        "/v1/results/{project}/{commit}",
        response_model=CommitResult,
        responses=_errors(400, 401, 503, s422="unknown project"),
        summary="What is known about a project at a commit",
    )
    async def result(
        project: str, commit: CommitPath, token: Token, operation: str | None = None
    ) -> CommitResult:
        """Per operation: its newest verdict (passed, failed, error, refused) and a newer
        job beside it that decided nothing yet (live, cancelled), as `fleetq result`
        answers."""
        async with acting(token) as (driver, _):
            answers = await readers.result(
                driver, project=project, commit=commit, operation=operation
            )
        return CommitResult(
            project=project,
            commit=commit.lower(),
            status=decision(answers),
            operations=answers,
        )

    @app.get(
        "/v1/whoami", response_model=Caller, responses=_errors(401, 503), summary="Who a token is"
    )
    async def whoami(token: Token) -> Caller:
        """The kind and identity the token acts as: a client's check of its credentials."""
        async with acting(token) as (_, caller):
            return caller

    add_runner_routes(app, notices, runs)

    @app.get(
        "/v1/health",
        response_model=Health,
        responses={503: {"model": Health, "description": "the database is out of reach"}},
        summary="Is the API up, and its database reachable",
    )
    async def health(response: Response) -> Health:
        """No token needed: for load balancers and probes. 503 while the database is
        unreachable; the API itself keeps serving and recovers when it is back."""
        try:
            return Health(status="ok", schema_version=await gateway.schema_version())
        except errors.FleetqError as exc:
            response.status_code = 503
            return Health(status="unavailable", error=str(exc))

    return app


def _secret(token: HTTPAuthorizationCredentials | None) -> str | None:
    return token.credentials if token is not None else None


_VALIDATION_ERROR = "#/components/schemas/HTTPValidationError"


def _documented(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """`app.openapi` without FastAPI's own 422 "Validation Error" answers: a request that
    does not validate is answered 400 here (`_handle_errors`), which each operation
    documents; a 422 an operation documents itself (an unknown project) stays."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()  # cached in app.openapi_schema: changed in place once
            for operations in schema["paths"].values():
                for operation in operations.values():
                    answer = operation["responses"].get("422", {})
                    shape = answer.get("content", {}).get("application/json", {})
                    if shape.get("schema", {}).get("$ref") == _VALIDATION_ERROR:
                        del operation["responses"]["422"]
            shapes = schema.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                shapes.pop(name, None)
        return app.openapi_schema  # type: ignore[return-value]

    return openapi


def _handle_errors(app: FastAPI) -> None:
    """One error shape for every failure, with the core's messages unchanged."""

    @app.exception_handler(errors.FleetqError)
    async def fleetq_error(_: Request, exc: errors.FleetqError) -> JSONResponse:
        status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)
        headers = {}
        if status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        elif status == 503:
            headers["Retry-After"] = "1"
        if status == 500:
            # a database error fleetq did not expect: its text may quote what was sent
            log.error("request failed: %s", exc, exc_info=exc)
            return _error(500, "internal", "internal error (a bug in fleetq; the server logged it)")
        # what a runner through the API may act on: an answer of fleetq's own, not a
        # proxy's or a route's (fleetq/runner/remote.py)
        headers[ERROR_HEADER] = _type_name(exc)
        return _error(status, _type_name(exc), str(exc), headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, "invalid_input", _validation_message(exc))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        kind = _HTTP_TYPES.get(exc.status_code, "http_error")
        return _error(exc.status_code, kind, str(exc.detail), dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.error("request failed", exc_info=exc)
        return _error(500, "internal", "internal error (a bug in fleetq; the server logged it)")


def _error(
    status: int, kind: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ErrorBody.model_validate({"error": {"type": kind, "message": message}})
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def _type_name(exc: errors.FleetqError) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()


def _validation_message(exc: RequestValidationError) -> str:
    """The first problem, by field, never echoing the value sent (it may be a secret)."""
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON"
    if tuple(first.get("loc", ())) == ("body",):
        return "the request body must be a JSON object (Content-Type: application/json)"
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "request"
    if first.get("type") == "missing":
        return f"{where} is required"
    if first.get("type") == "extra_forbidden":
        return f"{where} is not a field of this request"
    return f"{where}: {first.get('msg', 'invalid')}"
