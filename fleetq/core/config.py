"""Declarative fleet configuration: `fleetq apply FILE.toml`.

A file declares settings, lanes, identities and projects with their operations. It is
validated whole before anything is written, and written in one transaction, so a bad
file changes nothing. Errors name the file, the entry and the field
("fleet.toml: projects.web.operations.unit.lane: unknown lane 'chekcs' ...").
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from psycopg.types.json import Jsonb
from pydantic import BaseModel, ValidationError

from fleetq.core import queries
from fleetq.core.configschema import FleetConfig, OperationConfig, SettingsConfig
from fleetq.core.configschema import LimitsConfig as LimitsConfig  # runner.executor reads it here
from fleetq.core.db import SyncConnection
from fleetq.core.errors import ConfigError


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
        json.dumps(op.evidence.as_row()),
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
