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

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StringConstraints, ValidationError

from fleetq.runner import provenance

MAX_FILE_BYTES = 64 * 1024
# one argument of execve may not pass 128 KiB (MAX_ARG_STRLEN): the script is one
MAX_SCRIPT_BYTES = 100 * 1024
MARK = "fleetq-step"
# what decides where a job runs and what it may take: the fleet file's alone
FLEET_OWNED = ("lane", "capabilities", "memory_mb", "cpus", "limits", "node", "retry")
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# what a shell's exit status 128+N says a step died of, when N ends a process
_DEADLY = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 31)

StepName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
NoNul = Annotated[str, StringConstraints(pattern=r"^[^\x00]*$")]


class Step(BaseModel):
    """One step as the commit's file declares it (strict: `timeout_seconds = "9999"`
    is refused, not read as a number the cap check never saw)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: StepName | None = None
    command: NoNul = Field(min_length=1, max_length=4096)
    env: dict[Annotated[str, StringConstraints(pattern=_ENV_NAME)], NoNul] = Field(
        {}, max_length=100
    )
    cwd: NoNul = Field(".", min_length=1, max_length=256)
    timeout_seconds: StrictInt | None = Field(None, ge=1)


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
    (the operation's own command runs), Refused when it cannot run as it stands. Never
    raises for what the commit holds: its file is untrusted input."""
    facts: dict[str, Any] = {"file": relative}
    if _through_symlink(tree, relative):
        return Refused(f"{relative}: leads through a symlink", facts)
    if not (tree / relative).exists():
        return None
    found = provenance.inside(tree, relative)
    data = None if found is None else provenance.read_inside(found, MAX_FILE_BYTES)
    if data is None:
        kind = f"not a regular file of at most {MAX_FILE_BYTES // 1024} KiB inside the checkout"
        return Refused(f"{relative}: {kind}", facts)
    facts["sha256"] = hashlib.sha256(data).hexdigest()
    try:
        raw = tomllib.loads(data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as exc:
        return Refused(f"{relative}: not TOML ({type(exc).__name__}: {exc})"[:500], facts)
    if (why := _asks_for_more(raw)) is not None:
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
        if (why := _unrunnable(tree, step, name, cap_s)) is not None:
            return Refused(f"{relative}: {why}", facts)
    text = script(declared.steps, names, cap_s, grace_s)
    if (size := len(text.encode())) > MAX_SCRIPT_BYTES:
        return Refused(
            f"{relative}: its steps make a {size // 1024} KiB script, "
            f"over {MAX_SCRIPT_BYTES // 1024} KiB",
            facts,
        )
    return Plan(["/bin/sh", "-c", text, MARK], facts)


def _through_symlink(tree: Path, relative: str) -> bool:
    """Whether any part of `relative` (the file or a directory on its way) is a symlink:
    a commit's file is read where it is, never where a link points."""
    path = tree
    for part in Path(relative).parts:
        path = path / part
        if path.is_symlink():
            return True
        if not path.exists():
            return False
    return False


def _asks_for_more(raw: dict[str, Any]) -> str | None:
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
        env = step.get("env")
        for key in env if isinstance(env, dict) else {}:
            if key.upper().startswith("FLEETQ_"):
                return f"step {name!r} sets {key}: the runner sets FLEETQ_ variables"
    return None


def _unrunnable(tree: Path, step: Step, name: str, cap_s: int) -> str | None:
    if step.timeout_seconds is not None and step.timeout_seconds > cap_s:
        return (
            f"step {name!r} asks for timeout_seconds = {step.timeout_seconds}; "
            f"the operation allows at most {cap_s}"
        )
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
    return None


# One step: a preflight in a subshell (its directory, entered by its real path and still
# inside the checkout; its environment; its program, an executable file on its PATH as
# exec finds it, not a shell builtin of the same name),
# then the step itself in the background, watched by a timer that stops it at its
# timeout (TERM, then KILL after the grace); the timer's exit says whether it fired. A
# step killed by a signal that ends a process ends the script by the same signal, so the
# runner reads it (and a limit's reason) as it would the fleet file's command.
_RUN = """\
set -u
R=$(pwd -P)
fleetq_enter() {
    cd -P "./$1" 2>/dev/null || return 1
    case "$(pwd -P)/" in "$R"/*) return 0 ;; esac
    return 1
}
fleetq_which() {
    case "$1" in */*) [ -f "$1" ] && [ -x "$1" ]; return ;; esac
    (IFS=:; set -f; for d in $PATH; do
        if [ -f "${d:-.}/$1" ] && [ -x "${d:-.}/$1" ]; then exit 0; fi; done; exit 1)
}
fleetq_export() {
    while [ "$1" != "--" ]; do export "$1"; shift; done
}
fleetq_step() {
    i=$1; name=$2; t=$3; d=$4; prog=$5; shift 5
    if ! (fleetq_enter "$d"); then
        printf '%s %s %s: not run: cannot enter %s\\n' "$M" "$i" "$name" "$d"; return 126
    fi
    if ! (fleetq_enter "$d" && fleetq_export "$@" && fleetq_which "$prog"); then
        printf '%s %s %s: not run: %s not found\\n' "$M" "$i" "$name" "$prog"; return 127
    fi
    (fleetq_enter "$d" || exit 126; fleetq_export "$@"
     while [ "$1" != "--" ]; do shift; done; shift; exec "$@") &
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
        printf '%s %s %s: passed\\n' "$M" "$i" "$name"; return 0
    fi
    n=$((rc - 128))
    case " $DEADLY " in *" $n "*)
        printf '%s %s %s: failed: signal %s\\n' "$M" "$i" "$name" "$n"
        kill -"$n" $$; exit "$rc" ;;
    esac
    printf '%s %s %s: failed: exit %s\\n' "$M" "$i" "$name" "$rc"
    return "$rc"
}
"""


def script(steps: list[Step], names: list[str], cap_s: int, grace_s: float) -> str:
    """The shell script that runs `steps` in order and stops at the first that fails."""
    q = shlex.quote
    deadly = " ".join(map(str, _DEADLY))
    lines = [_RUN, f"M={MARK}; G={max(1, round(grace_s))}; DEADLY={q(deadly)}"]
    for i, (step, name) in enumerate(zip(steps, names, strict=True), 1):
        at = f"{i}/{len(steps)}"
        timeout = min(step.timeout_seconds or cap_s, cap_s)
        words = shlex.split(step.command)
        shown = f"{MARK} {at} {name}: {shlex.join(words)} (in {step.cwd}, timeout {timeout} s)"
        env = " ".join(q(f"{k}={v}") for k, v in sorted(step.env.items()))
        call = (
            f"fleetq_step {at} {q(name)} {timeout} {q(step.cwd)} {q(words[0])} {env} "
            f"-- {shlex.join(words)}"
        )
        lines += [f"printf '%s\\n' {q(shown)}", f"{call} || exit $?"]
    return "\n".join(lines) + "\n"


_LINE = re.compile(
    rf"{MARK} (?P<at>(?P<i>\d+)/(?P<n>\d+)) (?P<name>[A-Za-z0-9_.-]+): (?P<rest>.*)$"
)
_HOW = re.compile(
    r"passed|failed: exit (?P<code>\d+)|failed: signal (?P<signal>\d+)"
    r"|timed out after \d+ s|not run: .*"
)


def ended(tail: str, *, exit_code: int | None, signal: int | None) -> dict[str, str] | None:
    """How the steps ended, from the last `fleetq-step` line of the output's tail that
    agrees with how the script ended (`exit_code`, `signal`): {"step", "at", "how"}.
    A line a step printed itself, after the script's own, names another step or an end
    the exit status does not bear out: the first is only a wrong name, the second is
    passed over, so no line of a job's changes its outcome. A step's own line (its
    command) last means it was running when the run was stopped; None: no line at all.
    A marker is found anywhere in its line: a step's output need not end in a newline."""
    for line in reversed(tail.splitlines()):
        m = _LINE.search(line)
        if m is None:
            continue
        rest = m["rest"]
        how = _HOW.fullmatch(rest)
        if how is None:  # the line a step starts with
            if exit_code in (0, 124, 126, 127):
                continue  # the script ended it itself: not a run cut off
            return {"step": m["name"], "at": m["at"], "how": "did not end: the run was stopped"}
        if _bears_out(rest, how, m["i"] == m["n"], exit_code, signal):
            return {"step": m["name"], "at": m["at"], "how": rest}
        if rest == "passed" and exit_code is None:  # stopped before the next step began
            return {"step": m["name"], "at": m["at"], "how": "passed; the run was stopped"}
    return None


def _bears_out(
    rest: str, how: re.Match[str], last: bool, exit_code: int | None, signal: int | None
) -> bool:
    if rest == "passed":
        return exit_code == 0 and last
    if how["code"] is not None:
        return exit_code == int(how["code"])
    if how["signal"] is not None:
        return signal == int(how["signal"])
    if rest.startswith("timed out"):
        return exit_code == 124
    return exit_code in (126, 127)  # not run
