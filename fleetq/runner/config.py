"""A runner's configuration: command-line flags over an optional TOML file over defaults.

Capacity defaults come from the machine (psutil): total memory minus a reserve for the
system and the runner itself, and the CPU count. Both can be overridden, e.g. to share a
machine between two runners.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import psutil
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from fleetq.core.embedded import default_home
from fleetq.core.errors import ConfigError

MEMORY_RESERVE_MB = 512
DEFAULT_BATCH = 32
DEFAULT_POLL_S = 1.0
# While polls find nothing, each waits twice the one before, up to this: LISTEN/NOTIFY
# brings new work (submit, requeue, release, a freed dependency or cap), so a poll is
# only the fallback, and an idle fleet should cost the database next to nothing.
DEFAULT_POLL_MAX_S = 10.0
# Through the API (`api`), where each call is a request a gateway serves: the gateway's
# long poll says `gap` whenever a notice may have been missed (and every lane looks then),
# so a poll is a fallback's fallback; and the reaper's pass, whose leader does the work
# for the whole fleet, need not be tried by each runner every 5 s (a thousand runners
# tried it 200 times a second; at 15 s a fleet of three still tries every 5 s).
DEFAULT_POLL_MAX_API_S = 30.0
DEFAULT_REAP_API_S = 15.0
DEFAULT_GRACE_S = 30.0
DEFAULT_REAP_S = 5.0

NodeName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
LaneName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,62}$")]
Capability = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")]


class RunnerConfig(BaseModel):
    """Everything a runner needs to know, validated once at start-up."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: NodeName
    name: NodeName = "runner"
    lanes: dict[LaneName, Annotated[int, Field(ge=1, le=10_000)]] = Field(min_length=1)
    capabilities: list[Capability] = []
    memory_mb: int = Field(default_factory=lambda: default_memory_mb(), ge=0)
    cpus: float = Field(default_factory=lambda: float(psutil.cpu_count() or 1), ge=0)
    dsn: str | None = None
    # served through `fleetq api` instead (no DSN on this node): its URL, the file of
    # this runner's token (`fleetq tokens add runner NODE/NAME`), and a CA to trust
    api: Annotated[str, StringConstraints(pattern=r"^https?://[^\s]+$")] | None = None
    token_file: Path | None = None
    api_ca: Path | None = None
    work_dir: Path | None = None
    keep_failed: bool = False
    grace_s: float = Field(DEFAULT_GRACE_S, ge=0)
    poll_interval_s: float = Field(DEFAULT_POLL_S, gt=0)
    poll_max_s: float = Field(DEFAULT_POLL_MAX_S, gt=0)
    batch: int = Field(DEFAULT_BATCH, ge=1, le=1000)
    reap_interval_s: float = Field(DEFAULT_REAP_S, gt=0)
    exit_when_drained: bool = False
    # kill: job processes die with the runner; adopt: they outlive it, and a restarted
    # runner adopts them (see docs/recovery.md)
    orphans: Literal["kill", "adopt"] = "kill"
    # run each command job as its own uid of FIRST-LAST (the runner must be root), not
    # as the runner's uid; job_user USER is a range of one (USER's uid)
    job_uid_range: (
        Annotated[str, StringConstraints(pattern=r"^[0-9]{1,10}-[0-9]{1,10}$")] | None
    ) = None
    job_user: str | None = None

    @model_validator(mode="after")
    def _one_way_in(self) -> RunnerConfig:
        if self.api is not None and self.dsn is not None:
            raise ValueError("give a DSN or an API URL (api), not both")
        if self.api is not None and self.token_file is None:
            raise ValueError("api needs token_file: this runner's token (fleetq tokens add)")
        if self.api is None and (self.token_file or self.api_ca) is not None:
            raise ValueError("token_file and api_ca go with api (the API's URL)")
        return self

    @model_validator(mode="before")
    @classmethod
    def _api_polls_less(cls, values: Any) -> Any:
        if isinstance(values, dict) and values.get("api"):
            return {
                "poll_max_s": DEFAULT_POLL_MAX_API_S,
                "reap_interval_s": DEFAULT_REAP_API_S,
                **values,
            }
        return values

    @model_validator(mode="after")
    def _job_users_fit(self) -> RunnerConfig:
        if self.job_user is not None and self.job_uid_range is not None:
            raise ValueError("give job_user or job_uid_range, not both")
        if (self.job_user or self.job_uid_range) and self.orphans == "adopt":
            raise ValueError("job users work with orphans = kill only (for now)")
        if self.job_user is not None:
            self._cover_slots(f"job_user {self.job_user} is one uid", 1)
        elif (uids := self.job_uids) is not None:
            if not uids:
                raise ValueError(f"job_uid_range {self.job_uid_range} is empty (FIRST <= LAST)")
            self._cover_slots(
                f"job_uid_range {self.job_uid_range} holds {len(uids)} uid(s)", len(uids)
            )
        return self

    def _cover_slots(self, what: str, uids: int) -> None:
        """A job running at once needs a uid of its own: refuse fewer uids than slots."""
        slots = sum(self.lanes.values())
        if uids < slots:
            lanes = ", ".join(f"{lane}={n}" for lane, n in self.lanes.items())
            raise ValueError(
                f"{what} for {slots} slot(s) ({lanes}): each job running at once needs a "
                f"uid of its own; give job_uid_range at least {slots} uids"
            )

    @property
    def job_uids(self) -> range | None:
        """`job_uid_range` as the uids it holds (FIRST to LAST, both included)."""
        if self.job_uid_range is None:
            return None
        first, _, last = self.job_uid_range.partition("-")
        return range(int(first), int(last) + 1)

    @property
    def runner_id(self) -> str:
        """node/name: stable, so a restarted runner is the same runner."""
        return f"{self.node}/{self.name}"

    @property
    def cpu_millis(self) -> int:
        """CPUs in the database's unit."""
        return round(self.cpus * 1000)

    def directory(self) -> Path:
        """Where this runner stages trees, keeps mirrors and logs."""
        base = self.work_dir or default_home() / "runners"
        return base / f"{self.node}__{self.name}"


def default_memory_mb() -> int:
    """Total memory minus a reserve for the system and the runner."""
    total = psutil.virtual_memory().total // (1024 * 1024)
    return max(0, int(total) - MEMORY_RESERVE_MB)


def load(overrides: dict[str, object], config_file: Path | None) -> RunnerConfig:
    """Merge a TOML file (if any) with command-line overrides and validate the result."""
    values: dict[str, object] = {}
    if config_file is not None:
        try:
            values.update(tomllib.loads(config_file.read_text(encoding="utf-8")))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{config_file}: {exc}") from exc
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return RunnerConfig.model_validate(values)
    except ValidationError as exc:
        where = str(config_file) if config_file else "runner options"
        problems = [f"{where}: {_problem(e['loc'], e['msg'], e.get('ctx'))}" for e in exc.errors()]
        raise ConfigError("\n".join(problems)) from None


def _problem(loc: tuple[int | str, ...], msg: str, ctx: dict[str, Any] | None) -> str:
    """One validation error as `field: message` (a check of several fields names none,
    and says its own message, not pydantic's "Value error, ..." around it)."""
    if ctx and isinstance(ctx.get("error"), ValueError):
        msg = str(ctx["error"])
    return f"{'.'.join(map(str, loc))}: {msg}" if loc else msg
