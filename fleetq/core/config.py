"""Declarative fleet configuration: `fleetq apply FILE.toml`.

A file declares settings, lanes, identities and projects with their operations. It is
validated whole before anything is written, and written in one transaction, so a bad
file changes nothing. Errors name the file, the entry and the field
("fleet.toml: projects.web.operations.unit.lane: unknown lane 'chekcs' ...").
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal, Self
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from psycopg.types.json import Jsonb
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

from fleetq.core import queries
from fleetq.core.db import SyncConnection
from fleetq.core.errors import ConfigError

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


class ApplySummary(BaseModel):
    """What `apply` changed (rows inserted or updated) and what the fleet holds now."""

    changed: dict[str, int]
    totals: dict[str, int]


class OperationRow(BaseModel):
    """An operation as registered in the database."""

    project: str
    name: str
    lane: str
    command: str | None
    handler: str | None
    capabilities: list[str]
    memory_mb: int
    cpu_millis: int
    timeout_s: int

    @property
    def runs(self) -> str:
        """What the operation runs: its command or its handler."""
        return self.command or self.handler or ""


def operations(conn: SyncConnection) -> list[OperationRow]:
    """Every registered operation, by project and name."""
    cursor = conn.execute(queries.sql("config_operations"))
    columns = [c.name for c in cursor.description or []]
    return [OperationRow.model_validate(dict(zip(columns, row, strict=True))) for row in cursor]


def load(path: Path) -> FleetConfig:
    """Parse and validate a file; every problem is reported, each with its location."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    try:
        config = FleetConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError("\n".join(_describe(path, err) for err in exc.errors())) from None
    return _resolve_repositories(config, path.parent)


def check(conn: SyncConnection, config: FleetConfig, *, source: Path) -> None:
    """What `apply` checks against the database before writing (lanes an operation
    names must exist or be declared in the file), without writing anything."""
    _check_lanes(conn, config, source)


def apply(conn: SyncConnection, config: FleetConfig, *, source: Path) -> ApplySummary:
    """Upsert the configuration in one transaction; nothing is written if any entry fails.
    An apply that changed anything wakes every lane's runners when it commits, and tells
    every runner to read the settings and operations it keeps again."""
    with conn.transaction():
        _check_lanes(conn, config, source)
        changed = {
            "settings": _upsert_settings(conn, config.settings),
            "lanes": sum(
                _write(conn, "config_upsert_lane", [name, lane.description, lane.max_running])
                for name, lane in config.lanes.items()
            ),
            "identities": sum(
                _write(conn, "config_upsert_identity", [name, ident.role])
                for name, ident in config.identities.items()
            ),
            "projects": 0,
            "operations": 0,
        }
        for name, project in config.projects.items():
            changed["projects"] += _write(
                conn,
                "config_upsert_project",
                [
                    name,
                    project.repository,
                    project.release_gate,
                    project.description,
                    project.max_running,
                ],
            )
            for op_name, op in project.operations.items():
                changed["operations"] += _write(
                    conn, "config_upsert_operation", _op_row(name, op_name, op)
                )
        changed["schedules"] = sum(
            _write(
                conn,
                "config_upsert_schedule",
                [
                    name,
                    s.cron,
                    s.timezone,
                    s.project,
                    s.operation,
                    s.commit,
                    s.branch,
                    json.dumps(s.payload),
                    s.catch_up,
                ],
            )
            for name, s in config.schedules.items()
        )
        if any(changed.values()):
            # a job a cap held back was announced at its submit and by nothing since:
            # without this it would wait for a runner's poll (up to --poll-max)
            conn.execute(queries.sql("config_wake_lanes"))
            # runners keep the lease and offline settings (their beat) and operations:
            # each reads them again at this commit, not at its restart
            conn.execute(queries.sql("config_changed"))
        totals = {str(k): int(n) for k, n in conn.execute(queries.sql("config_summary"))}
    return ApplySummary(changed=changed, totals=totals)


def _op_row(project: str, name: str, op: OperationConfig) -> list[object]:
    return [
        project,
        name,
        op.lane,
        op.command,
        op.handler,
        sorted(set(op.capabilities)),
        op.memory_mb,
        op.cpu_millis,
        op.timeout_seconds,
        json.dumps(op.limits.as_row()),
        json.dumps(op.retry.as_row()),
    ]


def _upsert_settings(conn: SyncConnection, settings: SettingsConfig) -> int:
    values = settings.model_dump(exclude_none=True)
    return sum(
        _write(conn, "config_upsert_setting", [name, Jsonb(value)])
        for name, value in values.items()
    )


def _write(conn: SyncConnection, query: str, params: list[object]) -> int:
    return conn.execute(queries.sql(query), params).rowcount


def _check_lanes(conn: SyncConnection, config: FleetConfig, source: Path) -> None:
    """Operations may name lanes declared in this file or already registered."""
    known = set(config.lanes) | {str(n) for (n,) in conn.execute(queries.sql("config_lane_names"))}
    problems = [
        f"{source}: projects.{project}.operations.{op_name}.lane: unknown lane {op.lane!r} "
        f"(known: {', '.join(sorted(known)) or 'none; declare it under [lanes]'})"
        for project, p in config.projects.items()
        for op_name, op in p.operations.items()
        if op.lane not in known
    ]
    if problems:
        raise ConfigError("\n".join(problems))


def _resolve_repositories(config: FleetConfig, base: Path) -> FleetConfig:
    """A relative repository path is relative to the file, as a reader would assume."""
    projects = {
        name: p.model_copy(update={"repository": _resolve(p.repository, base)})
        for name, p in config.projects.items()
    }
    return config.model_copy(update={"projects": projects})


def _resolve(repository: str, base: Path) -> str:
    if "://" in repository or repository.startswith("git@") or Path(repository).is_absolute():
        return repository
    return str((base / repository).resolve())


def _describe(path: Path, error: object) -> str:
    assert isinstance(error, dict)
    loc = ".".join(str(part) for part in error["loc"]) or "(top level)"
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown field (check its spelling)"
    elif error["type"] == "string_pattern_mismatch":
        message = f"{message} (got {_short(error.get('input'))})"
    return f"{path}: {loc}: {message}"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "…"
