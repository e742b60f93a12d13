"""What the HTTP API takes and answers, beyond the core's own models (which it answers
as they are: `Job`, `SubmitResult`, `CancelResult`, `ResultAnswer`).

Request fields are typed loosely on purpose (a string is a string): the core's
validation checks them, so a request over HTTP is refused with the CLI's own message.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetq.core.models import Decision, ResultAnswer, SubmitResult

# What the core's validation.commit_sha accepts (and lower-cases), for the schema only:
# the core refuses anything else with the CLI's message, so pydantic does not check it.
COMMIT_PATTERN = "^[0-9a-fA-F]{40}$"


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not ignored


class SubmitRequest(_Request):
    """A job to submit; the identity (and so the priority class) is the token's."""

    project: str
    operation: str
    commit: str = Field(
        description="the full 40-hex commit SHA the job checks (any case)",
        json_schema_extra={"pattern": COMMIT_PATTERN},
    )
    node: str | None = Field(None, description="run only on this node")
    idempotency_key: str | None = Field(
        None, description="or the Idempotency-Key header: a repeat returns the same job"
    )
    task: str | None = Field(None, description="task id: its thread is told the outcome")
    # Any, so the core says what is wrong in the CLI's words ("payload must be a JSON
    # object"); the schema still documents the types.
    payload: Any = Field(None, json_schema_extra={"type": "object"})
    after: Any = Field(
        None,
        description="jobs that must succeed first; the job waits until they have",
        json_schema_extra={"type": "array", "items": {"type": "integer"}},
    )


class Submitted(SubmitResult):
    """A submit's answer: `created` is false when the idempotency key named an existing
    job. `warnings` says what was ignored (a malformed traceparent header, as W3C asks)."""

    location: str
    warnings: list[str] = Field(default_factory=list)


class CancelRequest(_Request):
    reason: str = ""


class CommitResult(BaseModel):
    """What is known about a project at a commit; `status` is the CLI's exit status in
    words: passed (every operation passed), failed (one ran and failed), error (none
    failed, one could not run: an error of the fleet, or refused), pending (one decided
    nothing yet: queued, running, cancelled, never asked)."""

    project: str
    commit: str
    status: Decision
    operations: list[ResultAnswer]


class Caller(BaseModel):
    kind: str
    identity: str | None


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    schema_version: int | None = None
    error: str | None = None


class ErrorDetail(BaseModel):
    type: str = Field(description="invalid_input, not_authenticated, permission_denied, …")
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail


class RunnerCall(_Request):
    """One statement of a runner's, by name (`fleetq/core/runnercalls.py`), with its
    arguments in the wire form of `fleetq/core/wire.py`."""

    name: str = Field(description="the statement's name, e.g. lease_heartbeat")
    args: list[Any] = Field(default_factory=list)
    timeout_s: float = Field(30.0, gt=0, le=120, description="the statement's own timeout")


class RunnerRows(BaseModel):
    """The statement's rows, in the wire form."""

    rows: list[dict[str, Any]]


class Notice(BaseModel):
    channel: Literal["fleetq_work", "fleetq_control"]
    payload: str


class Wake(BaseModel):
    """Notices after `after`; `gap` when some may have been missed (the gateway's LISTEN
    connection was away, or `after` is another process's or too old): then look at every
    lane and read the configuration again, as after a LISTEN connection comes back."""

    next: str = Field(description="pass as `after` in the next request")
    notices: list[Notice]
    gap: bool
