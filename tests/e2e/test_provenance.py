"""What a passing check rests on, from real runners (issue 47): the tool versions its
operation declares (asked once, again when the tool's file changes), its lockfiles'
hashes, how it was staged, its JUnit test counts; and `fleetq result --diff` naming what
differed between two runners' verdicts of one check."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetq.core import config
from fleetq.core.db import connect
from tests.e2e.conftest import ROOT, Repo, StartRunner, _git, job_state, stop, wait_until
from tests.e2e.test_runner import _submit

pytestmark = pytest.mark.slow

SUITE = """\
import os
os.makedirs("reports", exist_ok=True)
cases = '<testcase classname="t" name="a"/><testcase classname="t" name="b"/>'
skipped = '<testcase classname="t" name="c"><skipped/></testcase>'
with open("reports/junit.xml", "w") as f:
    f.write('<testsuites><testsuite name="s">' + cases + skipped + '</testsuite></testsuites>')
# a report that leads out of the checkout: never read (100 failures if it were)
os.symlink("{outside}", "reports/outside.xml")
"""

FLEET = """
[lanes.checks]
[projects.repo]
repository = "{repo}"
[projects.repo.operations.suite]
lane = "checks"
command = "python3 suite.py"
provenance = ["mytool --version"]
lockfiles = ["uv.lock", "package-lock.json"]
reports = ["reports/*.xml"]
"""

FAILURES = "".join(f'<testcase name="f{i}"><failure/></testcase>' for i in range(100))


def _tool(directory: Path, version: str) -> None:
    """A `mytool` that answers `version` and counts how often it was asked."""
    directory.mkdir(exist_ok=True)
    tool = directory / "mytool"
    tool.write_text(f'#!/bin/sh\necho asked >> "{directory}/asked"\necho "mytool {version}"\n')
    tool.chmod(0o755)


def _cli(dsn: str, *args: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "fleetq", "--dsn", dsn, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def test_two_runners_verdicts_carry_provenance_and_diff_names_the_tool(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.xml"
    outside.write_text(f"<testsuite>{FAILURES}</testsuite>")
    (repo.path / "suite.py").write_text(SUITE.format(outside=outside))
    (repo.path / "uv.lock").write_text("version = 1\n")
    _git(repo.path, "add", ".")
    _git(repo.path, "commit", "-qm", "suite")
    commit = _git(repo.path, "rev-parse", "HEAD")
    fleet = tmp_path / "suite.toml"
    fleet.write_text(FLEET.format(repo=repo.path))
    tools_a, tools_b = tmp_path / "tools-a", tmp_path / "tools-b"
    _tool(tools_a, "1.0")
    _tool(tools_b, "2.0")
    path = os.environ["PATH"]
    with connect(fleet_dsn, autocommit=True) as conn:
        config.apply(conn, config.load(fleet), source=fleet)

        def verdict_of(job: int) -> None:
            wait_until(
                lambda: job_state(conn, job) == "succeeded",
                what=f"job {job}",
                show=lambda: job_state(conn, job),
            )

        env_a = {"PATH": f"{tools_a}:{path}"}
        a = start_runner("node-a", lanes=("checks=1",), env=env_a)
        first = _submit(conn, "suite", commit)
        verdict_of(first)
        again = _submit(conn, "suite", commit)
        verdict_of(again)
        assert (tools_a / "asked").read_text().count("asked") == 1  # once per start
        _tool(tools_a, "1.1")  # the tool's file changed: asked again
        changed = _submit(conn, "suite", commit)
        verdict_of(changed)
        stop(a)
        env_b = {"PATH": f"{tools_b}:{path}"}
        start_runner("node-b", lanes=("checks=1",), env=env_b)
        other = _submit(conn, "suite", commit)
        verdict_of(other)

    code, out = _cli(fleet_dsn, "result", "repo", commit, "--operation", "suite")
    assert code == 0 and "2 passed, 0 failed, 1 skipped" in out, out
    code, out = _cli(fleet_dsn, "-v", "result", "repo", commit, "--operation", "suite")
    assert "tool: mytool --version → mytool 2.0" in out, out
    assert "lockfile: package-lock.json absent" in out and "lockfile: uv.lock sha256:" in out
    assert "runner: node-b/r on node-b" in out, out
    assert re.search(r"staging: mirror (cloned|fetched|warm), tree [0-9a-f]{40}\n", out), out

    code, out = _cli(fleet_dsn, "result", "repo", commit, "--diff", str(first))
    assert code == 0, out
    assert "environment.tools.mytool --version: mytool 2.0 → mytool 1.0" in out, out
    assert "environment.runner: node-b/r → node-a/r" in out, out
    assert "lockfiles" not in out and "tests" not in out, out  # the same in both
    code, out = _cli(fleet_dsn, "result", "repo", commit, "--diff", str(changed), "--json")
    (diff,) = json.loads(out)
    tools = [d for d in diff["differences"] if d["what"] == "environment.tools.mytool --version"]
    assert tools == [
        {"what": "environment.tools.mytool --version", "this": "mytool 2.0", "other": "mytool 1.1"}
    ], diff
