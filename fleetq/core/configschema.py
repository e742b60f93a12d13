"""The fleet file's schema: what `fleetq apply FILE.toml` accepts, as pydantic models.

Why apart from `config` (which loads a file and writes it to the database): the shape
of a file and the database writes change for different reasons, and readers such as
`configview` need only the shape. Every model is strict (an unknown field is an error,
so a misspelt key is reported rather than ignored) and frozen.
"""

from __future__ import annotations

import re
import shlex
from datetime import UTC, datetime
from typing import Annotated, Literal, Self
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

# The same alphabets as the CHECKs in migrations/0001_initial.sql.
LaneName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,62}$")]
EntryName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
IdentityName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")]
Capability = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")]
Handler = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")]


MIN_LIVENESS_SECONDS = 3


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SettingsConfig(_Strict):
    """Queue-wide settings; absent ones keep their current value."""

    lease_seconds: int | None = Field(None, le=86_400)
    reassignment_cap: int | None = Field(None, ge=1, le=1_000)
    runner_offline_after_seconds: int | None = Field(None, le=86_400)
    max_payload_bytes: int | None = Field(None, ge=1, le=16 * 1024 * 1024)
    aging_promote_after_seconds: int | None = Field(None, ge=1)

    @field_validator("lease_seconds", "runner_offline_after_seconds")
    @classmethod
    def _room_for_renewals(cls, value: int | None) -> int | None:
        """Runners renew every third of min(lease, offline threshold) and fence
        themselves a second before a lease could expire unrenewed: below 3 seconds a
        healthy runner would fence its own jobs or look offline between two renewals."""
        if value is not None and value < MIN_LIVENESS_SECONDS:
            raise ValueError(
                f"must be at least {MIN_LIVENESS_SECONDS} seconds: runners renew every "
                "third of it and must leave room for two renewals before a lease could "
                "expire (a shorter one fences healthy jobs or shows runners offline)"
            )
        return value


class LaneConfig(_Strict):
    """A lane: its own claim loop in every runner."""

    description: str = ""
    # fleet-wide: how many of its jobs may hold capacity at once (none: no cap)
    max_running: int | None = Field(None, ge=1, le=1_000_000)


class IdentityConfig(_Strict):
    """A submitting identity; `release-verification` jobs get priority class 0."""

    role: Literal["release-verification", "service", "operator"]


class LimitsConfig(_Strict):
    """Resource limits for each process of a command job (setrlimit); unset: none. A job
    past one ends failed, with the limit named as its reason."""

    memory_mb: int | None = Field(None, ge=1, le=16 * 1024 * 1024)  # address space
    cpu_seconds: int | None = Field(None, ge=1, le=7 * 86_400)
    open_files: int | None = Field(None, ge=16, le=1_048_576)
    output_mb: int | None = Field(None, ge=1, le=1024 * 1024)  # any file it writes, its log too

    def as_row(self) -> dict[str, int]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class RetryConfig(_Strict):
    """Application retries of an operation (none by default: a failed check is a verdict)."""

    max_attempts: int = Field(1, ge=1, le=100)  # in all, the first included
    backoff_seconds: float = Field(10, gt=0, le=86_400)  # before the second attempt
    backoff_max_seconds: float = Field(600, gt=0, le=7 * 86_400)  # it doubles up to this
    on: list[Literal["exception", "timeout", "exit"]] = ["exception"]  # failure reasons
    exit_codes: list[int] = []  # for "exit": only these codes (none listed: any)

    def as_row(self) -> dict[str, object]:
        """The policy as stored (operations.retry); {} when the operation never retries."""
        return {} if self.max_attempts == 1 else self.model_dump()


def _relative(value: str) -> str:
    """A path (or glob) inside the job's tree: never absolute, never through `..`."""
    if value.startswith("/") or ".." in value.split("/") or "\x00" in value:
        raise ValueError(f"{value!r}: a path relative to the checkout, without '..'")
    return value


TreePath = Annotated[str, StringConstraints(min_length=1, max_length=256)]
ToolCommand = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class EvidenceConfig(_Strict):
    """What a verdict of the operation records besides the commit (issue 47): the tool
    versions (each command run once per runner start and again when its program's file
    changes), the lockfiles hashed at the commit, the JUnit XML reports read after the
    run (paths or globs in the checkout), and the file of the commit its steps are read
    from, when it has one (`fleetq.runner.steps`)."""

    provenance: list[ToolCommand] = Field([], max_length=20)
    lockfiles: list[TreePath] = Field([], max_length=50)
    reports: list[TreePath] = Field([], max_length=20)
    steps_from: TreePath | None = None

    @field_validator("provenance")
    @classmethod
    def _commands(cls, value: list[str]) -> list[str]:
        for command in value:
            try:
                if not shlex.split(command):
                    raise ValueError(f"{command!r} names no program")
            except ValueError as exc:
                raise ValueError(f"{command!r}: cannot be split into words ({exc})") from None
        return value

    @field_validator("lockfiles", "reports")
    @classmethod
    def _inside(cls, value: list[str]) -> list[str]:
        return [_relative(v) for v in value]

    @field_validator("steps_from")
    @classmethod
    def _a_file_inside(cls, value: str | None) -> str | None:
        if value is not None and any(c in value for c in "*?["):
            raise ValueError(f"{value!r}: one file, not a glob")
        return None if value is None else _relative(value)

    def as_row(self) -> dict[str, list[str] | str]:
        """As stored (operations.evidence): only what is declared, so an operation that
        declares nothing stores `{}` (and an older file applies again unchanged)."""
        return {k: v for k, v in self.model_dump().items() if v}


class OperationConfig(_Strict):
    """An operation a project allows: a shell command or an in-process handler."""

    lane: LaneName
    command: str | None = Field(None, min_length=1)
    handler: Handler | None = None
    capabilities: list[Capability] = []
    memory_mb: int = Field(0, ge=0, le=16 * 1024 * 1024)
    cpus: float = Field(0, ge=0, le=4096)
    timeout_seconds: int = Field(3600, ge=1, le=7 * 86_400)
    limits: LimitsConfig = LimitsConfig()
    retry: RetryConfig = RetryConfig()
    # tool versions, lockfiles, test reports: `provenance = [...]` etc. beside `command`
    provenance: list[ToolCommand] = Field([], max_length=20)
    lockfiles: list[TreePath] = Field([], max_length=50)
    reports: list[TreePath] = Field([], max_length=20)
    # checks defined at the commit: its steps from this file when it has it, else `command`
    steps_from: TreePath | None = None

    @property
    def evidence(self) -> EvidenceConfig:
        """What its verdicts record besides the commit, checked as one."""
        return EvidenceConfig(
            provenance=self.provenance,
            lockfiles=self.lockfiles,
            reports=self.reports,
            steps_from=self.steps_from,
        )

    @field_validator("command")
    @classmethod
    def _splittable(cls, value: str | None) -> str | None:
        """A command runs as argv, split like a shell would (no shell runs): one that
        cannot be split would pass here and fail every job it is given."""
        if value is None:
            return value
        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot be split into words like a shell would ({exc})") from exc
        if not words:
            raise ValueError("names no program")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        if (self.command is None) == (self.handler is None):
            raise ValueError("give exactly one of `command` or `handler`")
        if self.handler is not None and self.limits.as_row():
            raise ValueError("`limits` apply to command jobs (a handler runs in the runner)")
        if self.handler is not None and (self.lockfiles or self.reports or self.steps_from):
            raise ValueError(
                "`lockfiles`, `reports` and `steps_from` are read from a command job's checkout"
            )
        self.evidence  # noqa: B018 -- checks them (EvidenceConfig's validators)
        return self

    @property
    def cpu_millis(self) -> int:
        """CPUs as integer millicpus, the database's unit."""
        return round(self.cpus * 1000)


class ProjectConfig(_Strict):
    """A registered repository and the operations it allows."""

    repository: str = Field(min_length=1)
    release_gate: bool = False
    description: str = ""
    # fleet-wide, across its lanes: how many of its jobs may hold capacity at once
    max_running: int | None = Field(None, ge=1, le=1_000_000)
    operations: dict[EntryName, OperationConfig] = {}


class ScheduleConfig(_Strict):
    """A job fired on a cron expression by the runners of its operation's lane
    (fleetq/core/schedules.py)."""

    cron: str = Field(min_length=1)  # five fields: minute hour day month weekday
    timezone: str = "UTC"  # an IANA zone; ticks follow its daylight-saving changes
    project: EntryName
    operation: EntryName
    commit: str | None = None  # a fixed 40-hex commit, or:
    branch: str | None = Field(None, min_length=1)  # its head, resolved at each tick
    payload: dict[str, object] = {}
    catch_up: Literal["none", "last", "all"] = "last"  # ticks missed while no leader ran

    @field_validator("cron")
    @classmethod
    def _parses(cls, value: str) -> str:
        try:
            CronSim(value, datetime.now(UTC))
        except CronSimError as exc:
            raise ValueError(f"not a cron expression ({exc})") from None
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r} (an IANA name, e.g. Europe/Berlin)"
            ) from None
        return value

    @field_validator("commit")
    @classmethod
    def _sha(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9a-f]{40}", value):
            raise ValueError("a full 40-character lower-case hex SHA (or give `branch`)")
        return value

    @model_validator(mode="after")
    def _one_commit(self) -> Self:
        if (self.commit is None) == (self.branch is None):
            raise ValueError("give exactly one of `commit` or `branch`")
        return self


class FleetConfig(_Strict):
    """A whole configuration file."""

    settings: SettingsConfig = SettingsConfig()
    lanes: dict[LaneName, LaneConfig] = {}
    identities: dict[IdentityName, IdentityConfig] = {}
    projects: dict[EntryName, ProjectConfig] = {}
    schedules: dict[LaneName, ScheduleConfig] = {}
