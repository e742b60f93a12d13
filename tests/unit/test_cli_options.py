"""The options people type after the verb are the ones `fleetq` takes before it."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from fleetq.cli import main
from fleetq.cli.main import build_parser, parse


@pytest.mark.parametrize(
    "argv",
    [
        ["--dsn", "postgresql:///a", "migrate"],
        ["migrate", "--dsn", "postgresql:///a"],
        ["--dsn", "postgresql:///elsewhere", "migrate", "--dsn", "postgresql:///a"],
    ],
)
def test_dsn_before_or_after_the_command(argv: list[str]) -> None:
    assert parse(argv).dsn == "postgresql:///a"


def test_no_dsn_anywhere_means_the_default() -> None:
    args = parse(["jobs"])
    assert (args.dsn, args.verbose, args.json) == (None, False, False)


@pytest.mark.parametrize(
    "argv", [["-v", "jobs"], ["jobs", "-v"], ["jobs", "--verbose"], ["server", "status", "-v"]]
)
def test_verbose_before_or_after_the_command(argv: list[str]) -> None:
    assert parse(argv).verbose is True


@pytest.mark.parametrize(
    "argv", [["--json", "jobs"], ["jobs", "--json"], ["--json", "server", "status"]]
)
def test_json_before_or_after_the_command(argv: list[str]) -> None:
    assert parse(argv).json is True


def test_json_before_a_command_without_json_output_is_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(["--json", "demo"])
    assert exit_.value.code == 64
    assert "`fleetq demo` has no --json output" in capsys.readouterr().err


def test_every_command_lists_the_connection_options_in_its_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse(["submit", "--help"])
    out = capsys.readouterr().out
    assert "--dsn DSN" in out and "--verbose" in out


def test_the_verb_table_is_what_the_modules_add() -> None:
    """A command loads only the module its verb names (main.VERBS): a verb added to a
    module but not to the table would be unknown on its own command line."""
    added: dict[str, str] = {}
    for name in main.MODULES:
        commands = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"fleetq.cli.{name}").register(commands)
        added |= dict.fromkeys(commands.choices, name)
    assert added == main.VERBS
    (listed,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(listed.choices) == list(main.VERBS)  # `--help` lists them as it did


@pytest.mark.parametrize(
    ("argv", "verb"),
    [
        (["result", "p", "c"], "result"),
        (["--dsn", "jobs", "result"], "result"),  # a DSN named like a verb is the DSN
        (["--dsn=x", "-v", "--json", "wait", "1"], "wait"),
        (["--help"], None),
        (["resul"], None),  # misspelt: the whole parser says which verbs there are
        ([], None),
    ],
)
def test_the_verb_is_found_past_the_options_before_it(argv: list[str], verb: str | None) -> None:
    assert main.verb_of(argv) == verb


def test_a_command_loads_only_its_own_module() -> None:
    """`fleetq result` in a CI loop paid for FastAPI, Textual pieces and the benchmark
    lab on every call (issue 42, item 7). Here: what parsing it imports."""
    probe = (
        "import sys; from fleetq.cli.main import parse; parse(['result', 'p', '0' * 40]); "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('fastapi', 'uvicorn', 'textual') or m.startswith(('fleetq_bench', 'fleetq.api', "
        "'fleetq.console', 'fleetq.runner', 'fleetq.demo')))))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []
