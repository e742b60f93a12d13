"""Checks defined at the commit: an operation's steps read from a file of the staged tree
(`steps_from = ".fleetq/checks.toml"`), run in order by one POSIX shell (issue 47).

Why the commit: one command in the fleet file had to serve fourteen years of a
repository's history; GitHub Actions, Buildkite and GitLab let each commit carry its own
steps, so a commit that changed its test runner says so itself. Why the fleet file stays
the authority: a step may choose its command, environment, directory and a timeout
within the operation's, never its lane, capabilities, memory, CPUs or limits (those
decide where a job may run and what it may take, before it is claimed); a file asking
for them is refused with the reason, and the verdict is an error, not a failure.

Why one shell: an execution is one process group (its start report, its stop, its
adoption after a restart all follow one pid), so the steps run as one `sh -c` script.
Each step's words are quoted back as they were split (no shell interprets them, as for
the fleet file's command); its timeout is kept by a watchdog of its own. The script
writes one `fleetq-step` line before and after each step into the job's output, where a
person reads them, and the last one says how the run ended, which the runner reads back
from the output's tail.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from fleetq.runner import provenance

MAX_FILE_BYTES = 64 * 1024
MARK = "fleetq-step"
# what decides where a job runs and what it may take: the fleet file's alone
FLEET_OWNED = ("lane", "capabilities", "memory_mb", "cpus", "limits", "node", "retry")
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"

StepName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class Step(BaseModel):
    """One step as the commit's file declares it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: StepName | None = None
    command: str = Field(min_length=1, max_length=4096)
    env: dict[Annotated[str, StringConstraints(pattern=_ENV_NAME)], str] = Field({}, max_length=100)
    cwd: str = Field(".", min_length=1, max_length=256)
    timeout_seconds: int | None = Field(None, ge=1)


class StepsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: list[Step] = Field(min_length=1, max_length=50)


@dataclass(frozen=True)
class Refused:
    """The file exists but cannot be run as it stands: why, and what it was."""

    reason: str
    facts: dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """The steps to run, as the argv of one shell, and what the verdict records."""

    argv: list[str]
    facts: dict[str, Any] = field(default_factory=dict)


def plan(tree: Path, relative: str, *, cap_s: int, grace_s: float) -> Plan | Refused | None:
    """The steps `relative` declares in `tree`; None when the commit has no such file
    (the operation's own command runs), Refused when it cannot run as it stands."""
    facts: dict[str, Any] = {"file": relative}
    path = tree / relative
    if not path.exists() and not path.is_symlink():
        return None
    found = provenance.inside(tree, relative)
    data = None if found is None else provenance.read_inside(found, MAX_FILE_BYTES)
    if data is None:
        kind = f"not a regular file of at most {MAX_FILE_BYTES // 1024} KiB inside the checkout"
        return Refused(f"{relative}: {kind}", facts)
    facts["sha256"] = hashlib.sha256(data).hexdigest()
    try:
        raw = tomllib.loads(data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return Refused(f"{relative}: not TOML ({exc})", facts)
    if (why := _asks_for_more(raw, cap_s)) is not None:
        return Refused(f"{relative}: {why}", facts)
    try:
        declared = StepsFile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return Refused(f"{relative}: {where}: {first['msg']}", facts)
    names = [s.name or f"step-{i}" for i, s in enumerate(declared.steps, 1)]
    facts["names"] = names
    for step, name in zip(declared.steps, names, strict=True):
        if (why := _unrunnable(tree, step, name)) is not None:
            return Refused(f"{relative}: {why}", facts)
    return Plan(["/bin/sh", "-c", script(declared.steps, names, cap_s, grace_s), MARK], facts)


def _asks_for_more(raw: dict[str, Any], cap_s: int) -> str | None:
    """Why the file asks for what only the fleet file decides, if it does."""
    steps = raw.get("steps")
    if not isinstance(steps, list):
        return None  # the model says what is wrong with it
    for i, step in enumerate(steps, 1):
        if not isinstance(step, dict):
            continue
        name = step.get("name") or f"step-{i}"
        for key in FLEET_OWNED:
            if key in step:
                return (
                    f"step {name!r} asks for {key}: the fleet file decides lane, "
                    "capabilities, node, memory, CPUs, limits and retries"
                )
        asked = step.get("timeout_seconds")
        if isinstance(asked, int) and asked > cap_s:
            return (
                f"step {name!r} asks for timeout_seconds = {asked}; "
                f"the operation allows at most {cap_s}"
            )
        env = step.get("env")
        for key in env if isinstance(env, dict) else {}:
            if key.upper().startswith("FLEETQ_"):
                return f"step {name!r} sets {key}: the runner sets FLEETQ_ variables"
    return None


def _unrunnable(tree: Path, step: Step, name: str) -> str | None:
    try:
        words = shlex.split(step.command)
    except ValueError as exc:
        return f"step {name!r}: its command cannot be split into words ({exc})"
    if not words:
        return f"step {name!r}: its command names no program"
    if step.cwd.startswith("/") or ".." in step.cwd.split("/"):
        return f"step {name!r}: cwd {step.cwd!r} is not a path inside the checkout"
    where = (tree / step.cwd).resolve()
    if not where.is_relative_to(tree.resolve()) or not where.is_dir():
        return f"step {name!r}: cwd {step.cwd!r} is no directory inside the checkout"
    if any("\x00" in v for v in step.env.values()):
        return f"step {name!r}: an env value holds a NUL byte"
    return None


# One step: a preflight in a subshell (its directory, its environment, its program), then
# the step itself in the background, watched by a timer that stops it at its timeout
# (TERM, then KILL after the grace). The timer's exit says whether it fired.
_RUN = """\
set -u
fleetq_step() {
    i=$1; name=$2; t=$3; d=$4; shift 4
    if ! (cd "$d" 2>/dev/null) ; then
        printf '%s %s %s: not run: cannot enter %s\\n' "$M" "$i" "$name" "$d"; return 126
    fi
    if ! (cd "$d" && while [ "$1" != "--" ]; do export "$1"; shift; done; shift;
          command -v "$1") >/dev/null 2>&1; then
        while [ "$1" != "--" ]; do shift; done; shift
        printf '%s %s %s: not run: %s not found\\n' "$M" "$i" "$name" "$1"; return 127
    fi
    (cd "$d" && while [ "$1" != "--" ]; do export "$1"; shift; done; shift; exec "$@") &
    c=$!
    (
        fired=0
        trap 'kill $s 2>/dev/null; exit $fired' TERM
        sleep "$t" & s=$!; wait $s
        fired=124
        printf '%s %s %s: timed out after %s s\\n' "$M" "$i" "$name" "$t"
        kill -TERM "$c" 2>/dev/null
        sleep "$G" & s=$!; wait $s
        kill -KILL "$c" 2>/dev/null
        exit 124
    ) &
    w=$!
    wait "$c"; rc=$?
    kill "$w" 2>/dev/null; wait "$w"; fired=$?
    if [ "$fired" -eq 124 ]; then return 124; fi
    if [ "$rc" -eq 0 ]; then
        printf '%s %s %s: passed\\n' "$M" "$i" "$name"
    else
        printf '%s %s %s: failed: exit %s\\n' "$M" "$i" "$name" "$rc"
    fi
    return "$rc"
}
"""


def script(steps: list[Step], names: list[str], cap_s: int, grace_s: float) -> str:
    """The shell script that runs `steps` in order and stops at the first that fails."""
    q = shlex.quote
    lines = [_RUN, f"M={MARK}; G={max(1, round(grace_s))}"]
    for i, (step, name) in enumerate(zip(steps, names, strict=True), 1):
        at = f"{i}/{len(steps)}"
        timeout = min(step.timeout_seconds or cap_s, cap_s)
        words = shlex.split(step.command)
        shown = f"{MARK} {at} {name}: {shlex.join(words)} (in {step.cwd}, timeout {timeout} s)"
        env = " ".join(q(f"{k}={v}") for k, v in sorted(step.env.items()))
        call = f"fleetq_step {at} {q(name)} {timeout} {q(step.cwd)} {env} -- {shlex.join(words)}"
        lines += [f"printf '%s\\n' {q(shown)}", f"{call} || exit $?"]
    return "\n".join(lines) + "\n"


_END = re.compile(
    rf"^{MARK} (?P<at>\d+/\d+) (?P<name>[A-Za-z0-9_.-]+): "
    r"(?P<how>passed|failed: exit \d+|timed out after \d+ s|not run: .*)$"
)


def ended(tail: str) -> dict[str, str] | None:
    """How the steps ended, from the last `fleetq-step` line of the output's tail:
    {"step", "at", "how"}; None when it has none (the run was stopped, say)."""
    for line in reversed(tail.splitlines()):
        if (m := _END.match(line.strip())) is not None:
            return {"step": m["name"], "at": m["at"], "how": m["how"]}
    return None
