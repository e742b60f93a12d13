"""The HTTP producer API: submit (idempotent by key), a job's status, a commit's result,
cancel, whoami and health, as JSON with an OpenAPI document (/openapi.json, /docs).

Every call but health acts for its bearer token (`fleetq tokens`), in one transaction,
through the same core functions the CLI calls: the same validation, the same messages,
and the protocol's own checks of who may do what. Errors answer
`{"error": {"type", "message"}}` with the status a client can act on (400 bad input,
401 no valid token, 403 not allowed, 404 no such job, 409 a conflicting key, 422 an
unknown project or operation, 503 database unreachable or busy: retry).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException

from fleetq import __version__
from fleetq.api.gateway import Gateway, job_path
from fleetq.api.limits import BodyLimit
from fleetq.api.models import (
    Caller,
    CancelRequest,
    CommitResult,
    ErrorBody,
    Health,
    SubmitRequest,
    Submitted,
)
from fleetq.core import errors, producer, readers, validation
from fleetq.core.models import CancelResult, Job, JobId, decision

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
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in [
        (400, "the request is malformed (the CLI's message says which field)"),
        (401, "no token, or an unknown or revoked one"),
        (403, "the token's holder may not do this"),
        (503, "the database is unreachable or busy: retry"),
    ]
}


def create_app(gateway: Gateway, *, max_body: int = DEFAULT_MAX_BODY) -> FastAPI:
    """The application over `gateway`, which it opens at start and closes at the end."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gateway.open()
        try:
            yield
        finally:
            await gateway.close()

    app = FastAPI(
        title="fleetq",
        version=__version__,
        summary="Submit jobs to a fleetq queue and read their results.",
        lifespan=lifespan,
    )
    app.add_middleware(BodyLimit, max_bytes=max_body)
    _handle_errors(app)

    @app.post(
        "/v1/jobs",
        status_code=201,
        response_model=Submitted,
        responses={
            **_ERRORS,
            200: {"model": Submitted, "description": "the idempotency key's existing job"},
            409: {"model": ErrorBody, "description": "the key names a different request"},
            422: {
                "model": ErrorBody,
                "description": "unknown project or operation, or an `after` job not found",
            },
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
        a malformed one is ignored (as the standard asks) and said so in `warnings`."""
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
        async with gateway.acting(_secret(token)) as (driver, caller):
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
        location = job_path(answer.job_id)
        response.headers["Location"] = location
        if not answer.created:
            response.status_code = 200
        return Submitted(**answer.model_dump(), location=location, warnings=warnings)

    @app.get(
        "/v1/jobs/{job_id}",
        response_model=Job,
        responses={**_ERRORS, 404: {"model": ErrorBody, "description": "no such job"}},
        summary="A job's state",
    )
    async def job(job_id: JobPath, token: Token) -> Job:
        """The job as `fleetq jobs --json` shows it: state, lease, budgets (attempts,
        lost, reassigned), what it waits on, its trace context."""
        async with gateway.acting(_secret(token)) as (driver, _):
            return await readers.job(driver, JobId(job_id))

    @app.post(
        "/v1/jobs/{job_id}/cancel",
        response_model=CancelResult,
        responses={**_ERRORS, 404: {"model": ErrorBody, "description": "no such job"}},
        summary="Cancel a job",
    )
    async def cancel(
        job_id: JobPath, token: Token, body: CancelRequest | None = None
    ) -> CancelResult:
        """Terminal at once; a running job shows stop pending until its runner confirms
        the stop. A submitter's token cancels only its own jobs; cancelling a finished
        job changes nothing."""
        async with gateway.acting(_secret(token)) as (driver, caller):
            return await producer.cancel(
                driver,
                job_id=JobId(job_id),
                actor=caller.identity or "api",
                reason=(body or CancelRequest()).reason,
            )

    @app.get(
        "/v1/results/{project}/{commit}",
        response_model=CommitResult,
        responses={**_ERRORS, 422: {"model": ErrorBody, "description": "unknown project"}},
        summary="What is known about a project at a commit",
    )
    async def result(
        project: str, commit: str, token: Token, operation: str | None = None
    ) -> CommitResult:
        """Per operation: its newest verdict (passed, failed, error, refused) and a newer
        job beside it that decided nothing yet (live, cancelled), as `fleetq result`
        answers."""
        async with gateway.acting(_secret(token)) as (driver, _):
            answers = await readers.result(
                driver, project=project, commit=commit, operation=operation
            )
        return CommitResult(
            project=project,
            commit=commit.lower(),
            status=decision(answers),
            operations=answers,
        )

    @app.get("/v1/whoami", response_model=Caller, responses=_ERRORS, summary="Who a token is")
    async def whoami(token: Token) -> Caller:
        """The kind and identity the token acts as: a client's check of its credentials."""
        async with gateway.acting(_secret(token)) as (_, caller):
            return caller

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
