"""Test results from the JUnit XML reports a run wrote (pytest --junitxml, unittest
runners, Jest, Go, Maven all write the format), read with `junitparser`.

Why: "passed, exit 0" says nothing of what ran; "901 passed, 0 failed, 3 skipped" does,
and the failing tests' names let `fleetq stats` flag a test that failed and then passed
at the same commit (flaky). The reports are the job's files: read only inside its
checkout, no symlink followed, at most MAX_REPORT_BYTES in all; an unreadable report is
named in the result, never a reason to lose the outcome.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any
from xml.etree.ElementTree import ParseError

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase

from fleetq.runner.provenance import inside, read_inside

MAX_REPORT_BYTES = 64 * 1024 * 1024  # every report of one run together
MAX_NAMED = 50  # failing tests named per verdict
MAX_FILES = 200


def read(tree: Path, patterns: list[str]) -> dict[str, Any] | None:
    """Counts and failing names from the reports matching `patterns` in `tree`; None when
    the operation declares none."""
    if not patterns:
        return None
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failing: list[str] = []
    unreadable: list[str] = []
    files = _matches(tree, patterns)
    left = MAX_REPORT_BYTES
    for relative, path in files:
        data = read_inside(path, left)
        if data is None:
            unreadable.append(f"{relative}: over {MAX_REPORT_BYTES} bytes in all, or gone")
            continue
        left -= len(data)
        try:
            root = JUnitXml.fromstring(data)._elem  # nested suites too: every testcase
            cases = [TestCase.fromelem(e) for e in root.iter("testcase")]  # type: ignore[no-untyped-call]
        except (ParseError, ValueError) as exc:
            unreadable.append(f"{relative}: not JUnit XML ({exc})")
            continue
        for case in cases:
            kind = _kind(case)
            counts[kind] += 1
            if kind in ("failed", "errors") and len(failing) < MAX_NAMED:
                failing.append(f"{case.classname}::{case.name}" if case.classname else case.name)
    found: dict[str, Any] = {**counts, "reports": len(files)}
    if failing:
        found["failing"] = failing
    if unreadable:
        found["unreadable"] = unreadable
    if not files:
        found["unreadable"] = [f"no report matched {', '.join(patterns)}"]
    return found


def _matches(tree: Path, patterns: list[str]) -> list[tuple[str, Path]]:
    seen: dict[Path, str] = {}
    for pattern in patterns:
        for relative in sorted(glob.glob(pattern, root_dir=tree, recursive=True)):
            path = inside(tree, relative)
            if path is not None and path not in seen and len(seen) < MAX_FILES:
                seen[path] = relative
    return [(relative, path) for path, relative in seen.items()]


def _kind(case: TestCase) -> str:
    results = case.result
    if any(isinstance(r, Error) for r in results):
        return "errors"
    if any(isinstance(r, Failure) for r in results):
        return "failed"
    if any(isinstance(r, Skipped) for r in results):
        return "skipped"
    return "passed"
