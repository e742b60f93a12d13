"""The options people type after the verb are the ones `fleetq` takes before it."""

from __future__ import annotations

import pytest

from fleetq.cli.main import parse


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
