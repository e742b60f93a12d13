"""The fleet's configuration as the database has it, and how a file differs from it.

`fleetq apply` upserts what a file names; it never removes, and a field a file leaves
out takes its default (a lane's description was wiped that way, silently). So before
applying, and on demand (`fleetq config diff FILE`), fleetq says what would change: new
entries, changed fields, fields reset to a default because the file omits them, and
entries the database keeps that the file does not name. `fleetq config show` prints the
current configuration as a file `fleetq apply` takes back unchanged.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from fleetq.core import queries
from fleetq.core.configschema import (
    EvidenceConfig,
    FleetConfig,
    IdentityConfig,
    LaneConfig,
    LimitsConfig,
    OperationConfig,
    ProjectConfig,
    RetryConfig,
    ScheduleConfig,
    SettingsConfig,
)
from fleetq.core.db import SyncConnection


class ChangeKind(StrEnum):
    ADD = "add"  # a new entry
    CHANGE = "change"  # a field the file sets to another value
    RESET = "reset"  # a field the file leaves out: apply sets it back to its default
    KEEP = "keep"  # in the database, not in the file: apply leaves it alone


class Change(BaseModel):
    kind: ChangeKind
    path: str  # lanes.checks.description, projects.web.operations.unit, ...
    before: Any = None
    after: Any = None

    def describe(self) -> str:
        match self.kind:
            case ChangeKind.ADD:
                return f"+ {self.path} (new)"
            case ChangeKind.CHANGE:
                return f"~ {self.path}: {_show(self.before)} -> {_show(self.after)}"
            case ChangeKind.RESET:
                return (
                    f"! {self.path}: not in the file, so reset from {_show(self.before)} to "
                    f"its default {_show(self.after)}"
                )
            case ChangeKind.KEEP:
                return f"= {self.path}: in the database, not in the file (apply keeps it)"


def current(conn: SyncConnection) -> FleetConfig:
    """What the database holds, as the same model a file is read into."""

    def rows(name: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in conn.execute(queries.sql(name)).fetchall()]

    known = set(SettingsConfig.model_fields)
    settings = SettingsConfig.model_validate(
        {name: value for name, value in rows("configview_settings") if name in known}
    )
    lanes = {
        name: LaneConfig(description=d, max_running=cap)
        for name, d, cap in rows("configview_lanes")
    }
    identities = {name: IdentityConfig(role=role) for name, role in rows("configview_identities")}
    projects: dict[str, ProjectConfig] = {}
    operations: dict[str, dict[str, OperationConfig]] = {}
    for (
        project,
        name,
        lane,
        command,
        handler,
        caps,
        memory,
        cpu,
        timeout,
        limits,
        retry,
        evidence,
    ) in rows("configview_operations"):
        operations.setdefault(project, {})[name] = OperationConfig(
            lane=lane,
            command=command,
            handler=handler,
            capabilities=list(caps),
            memory_mb=memory,
            cpus=cpu / 1000,
            timeout_seconds=timeout,
            limits=LimitsConfig.model_validate(limits or {}),
            retry=RetryConfig.model_validate(retry or {}),
            **EvidenceConfig.model_validate(evidence or {}).model_dump(),
        )
    for name, repository, gate, description, cap in rows("configview_projects"):
        projects[name] = ProjectConfig(
            repository=repository,
            release_gate=gate,
            description=description,
            max_running=cap,
            operations=operations.get(name, {}),
        )
    schedules = {
        name: ScheduleConfig(
            cron=cron,
            timezone=zone,
            project=project,
            operation=operation,
            commit=commit,
            branch=branch,
            payload=payload or {},
            catch_up=catch_up,
        )
        for name, cron, zone, project, operation, commit, branch, payload, catch_up in rows(
            "configview_schedules"
        )
    }
    return FleetConfig(
        settings=settings,
        lanes=lanes,
        identities=identities,
        projects=projects,
        schedules=schedules,
    )


def diff(now: FleetConfig, wanted: FleetConfig) -> list[Change]:
    """What applying `wanted` would do to `now`, entry by entry, field by field."""
    changes: list[Change] = []
    for name, value in wanted.settings.model_dump(exclude_none=True).items():
        before = getattr(now.settings, name)
        if before != value:
            changes.append(
                Change(kind=ChangeKind.CHANGE, path=f"settings.{name}", before=before, after=value)
            )
    for section in ("lanes", "identities", "projects", "schedules"):
        have: dict[str, BaseModel] = getattr(now, section)
        want: dict[str, BaseModel] = getattr(wanted, section)
        for name, entry in want.items():
            changes += _entry(f"{section}.{_key(name)}", have.get(name), entry)
        changes += [
            Change(kind=ChangeKind.KEEP, path=f"{section}.{_key(name)}")
            for name in have
            if name not in want
        ]
    return changes


def _entry(path: str, have: BaseModel | None, want: BaseModel) -> list[Change]:
    if have is None:
        return [Change(kind=ChangeKind.ADD, path=path)]
    changes: list[Change] = []
    for field in type(want).model_fields:
        before, after = getattr(have, field), getattr(want, field)
        if field == "operations":
            for op, spec in after.items():
                changes += _entry(f"{path}.operations.{_key(op)}", before.get(op), spec)
            changes += [
                Change(kind=ChangeKind.KEEP, path=f"{path}.operations.{_key(op)}")
                for op in before
                if op not in after
            ]
            continue
        if _plain(before) == _plain(after):
            continue
        kind = ChangeKind.CHANGE if field in want.model_fields_set else ChangeKind.RESET
        changes.append(
            Change(kind=kind, path=f"{path}.{field}", before=_plain(before), after=_plain(after))
        )
    return changes


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(exclude_none=True)
    if isinstance(value, list):
        return sorted(value)
    return value


def to_toml(config: FleetConfig) -> str:
    """The configuration as a file `fleetq apply` reads back into the same thing."""
    out: list[str] = []

    def table(path: str, values: dict[str, Any]) -> None:
        out.append(f"[{path}]")
        out.extend(f"{_key(k)} = {_value(v)}" for k, v in values.items() if v is not None)
        out.append("")

    settings = config.settings.model_dump(exclude_none=True)
    if settings:
        table("settings", settings)
    for name, lane in config.lanes.items():
        table(f"lanes.{_key(name)}", lane.model_dump())
    for name, identity in config.identities.items():
        table(f"identities.{_key(name)}", identity.model_dump())
    for name, project in config.projects.items():
        table(f"projects.{_key(name)}", project.model_dump(exclude={"operations"}))
        for op_name, op in project.operations.items():
            path = f"projects.{_key(name)}.operations.{_key(op_name)}"
            table(path, op.model_dump(exclude={"limits", "retry"}))
            if limits := op.limits.as_row():
                table(f"{path}.limits", limits)
            if retry := op.retry.as_row():
                table(f"{path}.retry", retry)
    for name, schedule in config.schedules.items():
        table(f"schedules.{_key(name)}", schedule.model_dump(exclude={"payload"}))
        if schedule.payload:
            table(f"schedules.{_key(name)}.payload", dict(schedule.payload))
    return "\n".join(out)


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else repr(value)
