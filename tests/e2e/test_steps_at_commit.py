"""Checks defined at the commit (issue 47), from a real runner: commits with and without
`.fleetq/checks.toml` in one repository; the file's steps run with their environment,
directory and reports, the fleet file's command runs where there is no file, a file that
asks for what only the fleet file decides is refused (an error, with the reason), a step
whose program is missing is an error naming the tool, and a failing step stops the rest.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fleetq.core import config
from fleetq.core.db import connect
from tests.e2e.conftest import Repo, StartRunner, _git, job_state, wait_until
from tests.e2e.test_provenance import _cli
from tests.e2e.test_runner import _submit

pytestmark = pytest.mark.slow

FLEET = """
[lanes.checks]
[projects.repo]
repository = "{repo}"
[projects.repo.operations.check]
lane = "checks"
command = "python3 -c 'print(\\"the fleet file s command\\")'"
timeout_seconds = 300
memory_mb = 64
steps_from = ".fleetq/checks.toml"
reports = ["reports/*.xml"]
"""

REPORT = """\
import os, sys
os.makedirs("../reports", exist_ok=True)
n = int(sys.argv[1])
cases = "".join(f'<testcase classname="t" name="c{i}"/>' for i in range(n))
with open("../reports/junit.xml", "w") as f:
    f.write(f'<testsuite name="s">{cases}</testsuite>')
assert os.environ["MODE"] == "strict", os.environ.get("MODE")
print("ran", n, "tests in", os.path.basename(os.getcwd()))
"""

STEPS = """\
[[steps]]
name = "lint"
command = "python3 -c 'print(\\"linted\\")'"
timeout_seconds = 60

[[steps]]
name = "test"
command = "python3 report.py 7"
cwd = "tests"
env = {{ MODE = "strict" }}
{extra}
"""


def _commit(repo: Repo, message: str, checks: str | None) -> str:
    checks_file = repo.path / ".fleetq" / "checks.toml"
    if checks is None:
        checks_file.unlink(missing_ok=True)
    else:
        checks_file.parent.mkdir(exist_ok=True)
        checks_file.write_text(checks)
    _git(repo.path, "add", "-A")
    _git(repo.path, "commit", "-qm", message)
    return _git(repo.path, "rev-parse", "HEAD")


def test_commits_with_and_without_their_own_steps(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: Path
) -> None:
    (repo.path / "tests").mkdir()
    (repo.path / "tests" / "report.py").write_text(REPORT)
    without = _commit(repo, "no steps file", None)
    steps = _commit(repo, "steps of its own", STEPS.format(extra=""))
    more = _commit(repo, "asks for memory", STEPS.format(extra="memory_mb = 100000"))
    tool = _commit(
        repo, "a tool not installed", '[[steps]]\nname = "fmt"\ncommand = "no-such-tool-47 ."\n'
    )
    third = '[[steps]]\nname = "never"\ncommand = "python3 -c \'open(\\"ran\\", \\"w\\")\'"\n'
    (repo.path / "tests" / "report.py").write_text(REPORT + "sys.exit(3)\n")
    failing = _commit(repo, "a failing step", STEPS.format(extra="") + third)
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET.format(repo=repo.path))
    with connect(fleet_dsn, autocommit=True) as conn:
        config.apply(conn, config.load(fleet), source=fleet)
        start_runner("node-a", lanes=("checks=1",), extra=("--memory-mb", "1024"))
        jobs = {c: _submit(conn, "check", c) for c in (without, steps, more, tool, failing)}

        def ended() -> bool:
            return all(job_state(conn, j) in ("succeeded", "failed") for j in jobs.values())

        wait_until(
            ended,
            what="every commit's verdict",
            show=lambda: str({j: job_state(conn, j) for j in jobs.values()}),
        )
        states = {c: job_state(conn, j) for c, j in jobs.items()}

    def result(commit: str, *args: str) -> dict[str, object]:
        _code, out = _cli(fleet_dsn, "result", "repo", commit, "--json", *args)
        (answer,) = json.loads(out)
        return dict(answer)

    # no file: the fleet file's command ran, and the verdict says so
    assert states[without] == "succeeded"
    _code, out = _cli(fleet_dsn, "-v", "result", "repo", without)
    assert "steps: the operation's command (.fleetq/checks.toml absent at this commit)" in out, out

    # its own steps: both ran, in order, with their directory and environment
    assert states[steps] == "succeeded", result(steps)
    _code, out = _cli(fleet_dsn, "-v", "result", "repo", steps)
    assert "7 passed, 0 failed, 0 skipped" in out, out
    assert "operation: the steps of .fleetq/checks.toml (without it: python3 -c" in out, out
    assert re.search(
        r"steps: \.fleetq/checks\.toml sha256:[0-9a-f]{12} \(lint, test\); "
        r"step 2/2 test: passed",
        out,
    ), out
    _code, log = _cli(fleet_dsn, "logs", str(jobs[steps]))
    assert log.index("linted") < log.index("ran 7 tests in tests"), log

    # asking for what the fleet file decides: refused before anything ran, an error
    refused = result(more)
    assert refused["status"] == "error", refused
    assert "asks for memory_mb: the fleet file decides" in str(refused["reason"]), refused
    _code, out = _cli(fleet_dsn, "-v", "result", "repo", more)
    assert "failed input: steps" in out, out

    # a missing tool: an error that names it, not a red test
    missing = result(tool)
    assert missing["status"] == "error", missing
    assert "step fmt: no-such-tool-47 not found" in str(missing["reason"]), missing
    _code, out = _cli(fleet_dsn, "-v", "result", "repo", tool)
    assert "failed input: tool" in out, out
    assert re.search(r"step fmt: no-such-tool-47 not found +no report", out), out  # not "0 passed"

    # a failing step fails the check and stops the steps after it
    red = result(failing)
    assert red["status"] == "failed" and red["exit_code"] == 3, red
    _code, out = _cli(fleet_dsn, "-v", "result", "repo", failing)
    assert "step 2/3 test: failed: exit 3" in out, out
    _code, log = _cli(fleet_dsn, "logs", str(jobs[failing]))
    assert "never" not in log.split("test: failed: exit 3", 1)[1], log

    # the steps file is part of what a verdict rests on: --diff names it
    _code, out = _cli(fleet_dsn, "result", "repo", steps, "--diff", without)
    assert "steps.sha256" in out and "steps.absent" in out, out
