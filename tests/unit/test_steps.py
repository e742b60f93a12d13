"""A commit's steps file (fleetq.runner.steps): what is refused and why, and the shell
that runs the steps, run for real (its quoting, environment, directory, order, timeout)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from fleetq.core.configschema import OperationConfig
from fleetq.runner import steps

CAP = 600


def _plan(tree: Path, text: str, cap_s: int = CAP) -> steps.Plan | steps.Refused | None:
    (tree / "checks.toml").write_text(text)
    return steps.plan(tree, "checks.toml", cap_s=cap_s, grace_s=1)


def _run(tree: Path, text: str) -> tuple[int, str]:
    """Run the steps as the runner does: one process group, whatever the script leaves
    behind killed once it exits (the runner's clean-up after every run)."""
    planned = _plan(tree, text)
    assert isinstance(planned, steps.Plan), planned
    log = tree / "out.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            planned.argv,
            cwd=tree,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={"PATH": os.environ["PATH"]},
        )
        code = proc.wait(timeout=60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return code, log.read_text()


def _ended(out: str, code: int) -> dict[str, str] | None:
    """As the runner reads it: a negative status is the signal that ended the script."""
    if code < 0:
        return steps.ended(out, exit_code=None, signal=-code)
    return steps.ended(out, exit_code=code, signal=None)


def test_a_commit_without_the_file_runs_the_operation_s_command(tmp_path: Path) -> None:
    assert steps.plan(tmp_path, ".fleetq/checks.toml", cap_s=CAP, grace_s=1) is None


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('[[steps]]\ncommand = "make"\nmemory_mb = 9000\n', "asks for memory_mb: the fleet file"),
        ('[[steps]]\ncommand = "make"\nlane = "big"\n', "asks for lane: the fleet file"),
        ('[[steps]]\ncommand = "make"\ncapabilities = ["gpu"]\n', "asks for capabilities"),
        (
            '[[steps]]\nname = "t"\ncommand = "make"\ntimeout_seconds = 601\n',
            "step 't' asks for timeout_seconds = 601; the operation allows at most 600",
        ),
        (
            '[[steps]]\ncommand = "make"\nenv = { FLEETQ_FENCING_TOKEN = "9" }\n',
            "sets FLEETQ_FENCING_TOKEN: the runner sets FLEETQ_ variables",
        ),
        ('[[steps]]\ncommand = "make"\ncwd = "../.."\n', "is not a path inside the checkout"),
        ('[[steps]]\ncommand = "make"\ncwd = "nowhere"\n', "is no directory inside"),
        ('[[steps]]\ncommand = "make \'unclosed"\n', "cannot be split into words"),
        ('[[steps]]\ncommand = "make"\nshell = "bash"\n', "steps.0.shell: Extra inputs"),
        ("steps = []\n", "steps: List should have at least 1 item"),
        ('[[steps]]\ncommand = "make"\nenv = 5\n', "steps.0.env: Input should be a valid dict"),
        ('steps = ["make"]\n', "steps.0: Input should be a valid dictionary"),
        ("[[steps\n", "not TOML"),
        ("a = " + "[" * 600 + "]" * 600 + "\n", "not TOML (RecursionError"),
        ('[[steps]]\ncommand = "make"\ncwd = "a\\u0000b"\n', "steps.0.cwd: String should match"),
        ('[[steps]]\ncommand = "echo a\\u0000b"\n', "steps.0.command: String should match"),
        ('[[steps]]\ncommand = "make"\ntimeout_seconds = "9999"\n', "valid integer"),
        ('[[steps]]\ncommand = "make"\ntimeout_seconds = 9999.0\n', "valid integer"),
        ('[[steps]]\ncommand = "make"\ntimeout_seconds = true\n', "valid integer"),
        (
            "".join(f"[[steps]]\ncommand = \"echo '{'x' * 3000}'\"\n" for _ in range(20)),
            "script, over 100 KiB",
        ),
    ],
)
def test_a_file_that_asks_for_more_or_cannot_run_is_refused_with_the_reason(
    tmp_path: Path, text: str, why: str
) -> None:
    refused = _plan(tmp_path, text)
    assert isinstance(refused, steps.Refused), refused
    assert why in refused.reason, refused.reason
    assert len(refused.facts["sha256"]) == 64  # which file was refused


def test_a_file_that_leads_out_of_the_checkout_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.toml"
    outside.write_text('[[steps]]\ncommand = "true"\n')
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "checks.toml").symlink_to(outside)
    refused = steps.plan(tree, "checks.toml", cap_s=CAP, grace_s=1)
    assert isinstance(refused, steps.Refused) and "through a symlink" in refused.reason


def test_steps_run_in_order_with_their_words_environment_and_directory(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    code, out = _run(
        tmp_path,
        """
[[steps]]
name = "first"
command = "sh -c 'echo \\"$GREETING\\" in $(basename $(pwd))'"
env = { GREETING = "it's $HOME; `x`" }
cwd = "sub"
[[steps]]
command = "printf '%s|%s\\n' 'two words' $NOT_EXPANDED"
""",
    )
    assert code == 0, out
    assert "it's $HOME; `x` in sub\n" in out, out  # the value as written, not expanded
    assert "two words|$NOT_EXPANDED\n" in out, out  # words as split, no shell in between
    assert _ended(out, code) == {"step": "step-2", "at": "2/2", "how": "passed"}


def test_a_failing_step_stops_the_rest_and_says_which(tmp_path: Path) -> None:
    code, out = _run(
        tmp_path,
        """
[[steps]]
name = "build"
command = "sh -c 'exit 3'"
[[steps]]
name = "never"
command = "touch ran"
""",
    )
    assert code == 3
    assert _ended(out, code) == {"step": "build", "at": "1/2", "how": "failed: exit 3"}
    assert not (tmp_path / "ran").exists()


def test_a_missing_program_is_not_run_and_named(tmp_path: Path) -> None:
    code, out = _run(tmp_path, '[[steps]]\nname = "fmt"\ncommand = "no-such-tool-47 ."\n')
    assert code == 127
    assert _ended(out, code) == {
        "step": "fmt",
        "at": "1/1",
        "how": "not run: no-such-tool-47 not found",
    }


@pytest.mark.parametrize(
    "command",
    [
        "sleep 50",  # ends at its SIGTERM
        "sh -c 'trap \\\"\\\" TERM; sleep 50; touch survived'",  # ignores it: KILL after the grace
    ],
)
def test_a_step_is_stopped_at_its_own_timeout(tmp_path: Path, command: str) -> None:
    code, out = _run(
        tmp_path,
        f"""
[[steps]]
name = "slow"
command = "{command}"
timeout_seconds = 1
[[steps]]
command = "touch ran"
""",
    )
    assert code == 124, out
    assert _ended(out, code) == {"step": "slow", "at": "1/2", "how": "timed out after 1 s"}
    assert not (tmp_path / "ran").exists() and not (tmp_path / "survived").exists()


def test_steps_from_is_a_file_of_a_command_operation() -> None:
    ok = OperationConfig(lane="l", command="make", steps_from=".fleetq/checks.toml")
    assert ok.evidence.as_row() == {"steps_from": ".fleetq/checks.toml"}
    for bad in ("/etc/checks.toml", "../checks.toml", ".fleetq/*.toml"):
        with pytest.raises(ValueError, match=r"checkout|glob"):
            OperationConfig(lane="l", command="make", steps_from=bad)
    with pytest.raises(ValueError, match="read from a command job's checkout"):
        OperationConfig(lane="l", handler="tests.handlers:ok", steps_from="checks.toml")


def test_a_file_reached_through_a_symlinked_directory_is_refused(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "real").mkdir(parents=True)
    (tree / "real" / "checks.toml").write_text('[[steps]]\ncommand = "true"\n')
    (tree / ".fleetq").symlink_to("real")  # inside the tree, but a link all the same
    refused = steps.plan(tree, ".fleetq/checks.toml", cap_s=CAP, grace_s=1)
    assert isinstance(refused, steps.Refused) and "through a symlink" in refused.reason
    (tree / ".fleetq").unlink()
    (tree / ".fleetq").symlink_to("nowhere")  # dangling: not "absent" either
    refused = steps.plan(tree, ".fleetq/checks.toml", cap_s=CAP, grace_s=1)
    assert isinstance(refused, steps.Refused), refused


def test_a_directory_is_entered_by_its_path_in_the_checkout_and_must_stay_inside(
    tmp_path: Path,
) -> None:
    (tmp_path / "-P").mkdir()  # `cd -P` would read it as an option and go $HOME
    code, out = _run(tmp_path, '[[steps]]\ncommand = "pwd -P"\ncwd = "-P"\n')
    assert code == 0 and f"{tmp_path.resolve()}/-P\n" in out, out
    (tmp_path / "sub").mkdir()
    code, out = _run(
        tmp_path,
        """
[[steps]]
command = "sh -c 'rmdir sub && ln -s / sub'"
[[steps]]
name = "escape"
command = "touch escaped"
cwd = "sub"
""",
    )
    # planned when sub was a directory; a link out of the checkout by the time it runs
    assert code == 126, out
    assert _ended(out, code) == {"step": "escape", "at": "2/2", "how": "not run: cannot enter sub"}


def test_a_shell_builtin_is_no_program(tmp_path: Path) -> None:
    # `cd sub && make` in a step is a shell line, not words: no program `cd` runs
    code, out = _run(tmp_path, '[[steps]]\nname = "b"\ncommand = "cd sub"\n')
    assert code == 127, out
    assert _ended(out, code) == {"step": "b", "at": "1/1", "how": "not run: cd not found"}


def test_output_without_a_last_newline_does_not_hide_how_a_step_ended(tmp_path: Path) -> None:
    code, out = _run(
        tmp_path,
        """
[[steps]]
command = "true"
[[steps]]
name = "c"
command = "sh -c 'printf x; exit 3'"
""",
    )
    assert code == 3 and "xfleetq-step 2/2 c: failed: exit 3" in out, out
    assert _ended(out, code) == {"step": "c", "at": "2/2", "how": "failed: exit 3"}


def test_a_line_a_step_forges_does_not_change_its_outcome() -> None:
    # a step's leftover process prints after the script's own last line: the end the
    # exit status bears out is read, the forged one passed over
    real = (
        "fleetq-step 1/1 a: sh -c 'exit 1' (in ., timeout 60 s)\n"
        "fleetq-step 1/1 a: failed: exit 1\n"
    )
    forged = "fleetq-step 1/1 a: not run: make not found\n"
    assert steps.ended(real + forged, exit_code=1, signal=None) == {
        "step": "a",
        "at": "1/1",
        "how": "failed: exit 1",
    }
    assert steps.ended(forged, exit_code=0, signal=None) is None
    timed_out = "fleetq-step 1/1 a: timed out after 5 s\n"
    assert steps.ended(real + timed_out, exit_code=1, signal=None) == {
        "step": "a",
        "at": "1/1",
        "how": "failed: exit 1",
    }


def test_a_step_killed_by_a_signal_ends_the_script_by_it(tmp_path: Path) -> None:
    code, out = _run(tmp_path, '[[steps]]\nname = "crash"\ncommand = "sh -c \'kill -SEGV $$\'"\n')
    assert code == -signal.SIGSEGV, out  # as the fleet file's command would: a signal
    assert _ended(out, code) == {"step": "crash", "at": "1/1", "how": "failed: signal 11"}


def test_a_run_stopped_mid_step_names_the_step_it_was_in() -> None:
    tail = (
        "fleetq-step 1/2 a: true (in ., timeout 60 s)\n"
        "fleetq-step 1/2 a: passed\n"
        "fleetq-step 2/2 b: sleep 30 (in ., timeout 60 s)\n"
    )
    assert steps.ended(tail, exit_code=None, signal=15) == {
        "step": "b",
        "at": "2/2",
        "how": "did not end: the run was stopped",
    }
