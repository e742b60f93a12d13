"""A verdict's provenance read back: the lines `fleetq result -v` prints, the test counts'
one line, and what differs between two verdicts of one check (`--diff`).

Why here and not with the runner that gathers it (fleetq/runner/provenance.py): readers
(CLI, API, console) need only the shape, and the runner may be a newer or older version
than the reader; every key is read as optional.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

# what `--diff` compares, in this order
_PARTS = ("environment", "definition", "staging", "steps", "lockfiles", "tests")
_NOT_COMPARED = {"hash"}  # a part's hash differs whenever any of its keys does


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def tests_line(tests: Any) -> str:
    """ "901 passed, 0 failed, 3 skipped" (errors only when some), or "" with no reports."""
    tests = _dict(tests)
    if not tests:
        return ""
    if tests.get("reports") == 0:  # none written: no count is 0 passed
        return "no report"
    line = f"{tests.get('passed', 0)} passed, {tests.get('failed', 0)} failed"
    if tests.get("errors"):
        line += f", {tests['errors']} errors"
    line += f", {tests.get('skipped', 0)} skipped"
    if unreadable := _list(tests.get("unreadable")):
        line += f" ({len(unreadable)} unreadable)"
    return line


def lines(provenance: dict[str, Any] | None) -> list[str]:
    """What a verdict rests on, one fact a line, for a person. Written by a runner,
    which may be another version or plain wrong: a key of another shape is left out,
    never a reason to fail the reader (the CLI, the API, the console)."""
    if not provenance:
        return ["no provenance recorded (a runner older than fleetq 0.1 wrote it, or none ran)"]
    if "dropped" in provenance:
        return [f"provenance not kept: {provenance['dropped']}"]
    out: list[str] = []
    if failed := provenance.get("failed_input"):
        out.append(f"failed input: {failed}")
    if env := _dict(provenance.get("environment")):
        out.append(
            f"runner: {env.get('runner', '?')} on {env.get('node', '?')} "
            f"(fleetq {env.get('fleetq', '?')})"
        )
        out.append(f"machine: {env.get('os', '?')}, {env.get('kernel', '?')} {env.get('arch', '')}")
        for command, answer in sorted(_dict(env.get("tools")).items()):
            out.append(f"tool: {command} → {answer}")
    if staging := _dict(provenance.get("staging")):
        if "failed" in staging:
            out.append(f"staging: failed: {staging['failed']}")
        else:
            out.append(
                f"staging: mirror {staging.get('mirror', '?')}, tree {staging.get('tree', '?')}"
            )
    if steps := _dict(provenance.get("steps")):
        out.append(_steps_line(steps))
    for name, digest in sorted(_dict(provenance.get("lockfiles")).items()):
        out.append(f"lockfile: {name} {digest}")
    if definition := _dict(provenance.get("definition")):
        what = definition.get("command") or definition.get("handler") or "?"
        if steps.get("names") and not steps.get("refused"):  # the steps ran, not the command
            what = f"the steps of {steps.get('file', '?')} (without it: {what})"
        out.append(f"operation: {what} (timeout {definition.get('timeout_s', '?')} s)")
    if tests := _dict(provenance.get("tests")):
        out.append(f"tests: {tests_line(tests)}")
        out.extend(f"failing: {name}" for name in _list(tests.get("failing")))
        out.extend(f"report: {why}" for why in _list(tests.get("unreadable")))
    return out


def _steps_line(steps: dict[str, Any]) -> str:
    """Where the steps came from and how far they got, on one line."""
    where = steps.get("file", "?")
    if steps.get("absent"):
        return f"steps: the operation's command ({where} absent at this commit)"
    line = f"steps: {where} sha256:{str(steps.get('sha256', '?'))[:12]}"
    if names := _list(steps.get("names")):
        line += f" ({', '.join(map(str, names))})"
    if refused := steps.get("refused"):
        return f"{line}: refused: {refused}"
    if how := steps.get("how"):
        line += f"; step {steps.get('at', '?')} {steps.get('step', '?')}: {how}"
    return line


def differences(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[tuple[str, Any, Any]]:
    """(what, in a, in b) for every fact that differs, by dotted name
    (`environment.tools.python3 --version`); none when both rest on the same."""
    found: list[tuple[str, Any, Any]] = []
    for part in _PARTS:
        _walk(part, (a or {}).get(part), (b or {}).get(part), found)
    return found


def _walk(name: str, a: Any, b: Any, found: list[tuple[str, Any, Any]]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in _NOT_COMPARED:
                _walk(f"{name}.{key}", a.get(key), b.get(key), found)
    elif a != b:
        found.append((name, a, b))


class Difference(BaseModel):
    """One fact two verdicts differ in, by dotted name."""

    model_config = ConfigDict(frozen=True)

    what: str
    this: Any
    other: Any


class VerdictDiff(BaseModel):
    """A verdict against another of its check: what differed besides the commit."""

    model_config = ConfigDict(frozen=True)

    operation: str
    job: int
    verdict: str
    other_job: int | None  # None: the other side has no verdict of this operation
    other_verdict: str | None
    differences: list[Difference]


def compare(
    operation: str,
    mine: tuple[int, str, dict[str, Any] | None],
    theirs: tuple[int, str, dict[str, Any] | None] | None,
) -> VerdictDiff:
    """(job, verdict, provenance) of each side, compared."""
    job, verdict, facts = mine
    return VerdictDiff(
        operation=operation,
        job=job,
        verdict=verdict,
        other_job=None if theirs is None else theirs[0],
        other_verdict=None if theirs is None else theirs[1],
        differences=[]
        if theirs is None
        else [Difference(what=w, this=a, other=b) for w, a, b in differences(facts, theirs[2])],
    )
