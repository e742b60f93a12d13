"""Every command exits as the README's table says (issue 42, item 8): a malformed command
line 64, the database out of reach 69, a schema that needs `fleetq migrate` 78, a login
that may not do it 77, a job or project that does not exist 65. Per command, not per
case: a new verb is held to the table by being added to `COMMANDS` (a test below fails
until it is). 75 and 130 are each command's own (test_cli_exits, test_demo, test_removal).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fleetq.cli import main
from fleetq.core import roles
from fleetq.core.db import SyncConnection
from tests import fleet
from tests.fleet import SHA
from tests.integration.conftest import Login

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "fleet.toml")
UNKNOWN_JOB = "987654321"

# each verb on the database, with a command line that would do its work
COMMANDS: dict[str, list[str]] = {
    "migrate": ["migrate", "--status"],
    "apply": ["apply", EXAMPLE],
    "config": ["config", "show"],
    "submit": ["submit", "tools", "lint", "--commit", SHA],
    "cancel": ["cancel", UNKNOWN_JOB],
    "result": ["result", "tools", SHA],
    "jobs": ["jobs"],
    "explain": ["explain", UNKNOWN_JOB],
    "events": ["events"],
    "reap": ["reap"],
    "rerun": ["rerun", UNKNOWN_JOB],
    "wait": ["wait", UNKNOWN_JOB, "--timeout", "0"],
    "logs": ["logs", UNKNOWN_JOB],
    "runners": ["runners"],
    "drain": ["drain", "node-x/r"],
    "pause": ["pause", "node-x/r"],
    "resume": ["resume", "node-x/r"],
    "schedules": ["schedules"],
    "overlaps": ["overlaps"],
    "stats": ["stats"],
    "prune": ["prune", "--before", "30d", "--dry-run"],
    "roles": ["roles", "list"],
    "tokens": ["tokens", "list"],
}
# verbs not in COMMANDS, and why
ELSEWHERE = {
    "demo": "its own database and runners (tests/e2e/test_demo.py)",
    "server": "the embedded server, no DSN (tests/integration/test_embedded.py)",
    "api": "a server process (tests/integration/test_api.py)",
}
# what a reader login may not do: every verb that writes (77)
WRITES = (
    "apply",
    "submit",
    "cancel",
    "reap",
    "rerun",
    "drain",
    "pause",
    "resume",
    "prune",
    "roles",
    "tokens",
)
# a job or project that does not exist (65)
NOT_THERE = {
    "cancel": COMMANDS["cancel"],
    "explain": COMMANDS["explain"],
    "rerun": COMMANDS["rerun"],
    "wait": COMMANDS["wait"],
    "logs": COMMANDS["logs"],
    "result": ["result", "nosuch", SHA],
    "submit": ["submit", "nosuch", "lint", "--commit", SHA],
    "drain": COMMANDS["drain"],
    "pause": COMMANDS["pause"],
    "resume": COMMANDS["resume"],
}
# `events --job N` and `jobs --project P` are filters: nothing matches, nothing is listed (0)
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/fleetq?connect_timeout=3"


def fleetq(dsn: str, argv: list[str]) -> int:
    """The command's exit status, run as `fleetq --dsn DSN ARGV` is (argparse's usage
    errors raise SystemExit; a thread of its own: the CLI runs its own event loop)."""

    def command() -> int:
        try:
            return main.main(["--dsn", dsn, *argv])
        except SystemExit as exc:
            return int(exc.code or 0)

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(command).result()


def test_every_verb_is_held_to_the_table() -> None:
    assert sorted([*COMMANDS, *ELSEWHERE]) == sorted(main.VERBS)


@pytest.mark.parametrize("verb", sorted(main.VERBS))
def test_a_malformed_command_line_is_64(verb: str) -> None:
    assert fleetq(UNREACHABLE, [verb, "--no-such-option"]) == 64


@pytest.mark.parametrize("verb", sorted(COMMANDS))
def test_a_database_out_of_reach_is_69(verb: str) -> None:
    assert fleetq(UNREACHABLE, COMMANDS[verb]) == 69


def test_a_schema_that_needs_migrate_is_78(empty_dsn: str) -> None:
    statuses = {
        verb: fleetq(empty_dsn, argv) for verb, argv in COMMANDS.items() if verb != "migrate"
    }
    assert statuses == dict.fromkeys(statuses, 78)
    assert fleetq(empty_dsn, ["migrate", "--status"]) == 78  # it lists what is pending
    assert fleetq(empty_dsn, ["migrate"]) == 0
    assert fleetq(empty_dsn, ["migrate", "--status"]) == 0


def test_a_reader_may_not_write_77(login: Login, sync_conn: SyncConnection) -> None:
    reader = login(roles.Kind.READER, "dashboard")  # the fleet's operations are in
    statuses = {verb: fleetq(reader, COMMANDS[verb]) for verb in WRITES}
    assert statuses == dict.fromkeys(WRITES, 77)


def test_what_does_not_exist_is_65(db_dsn: str, sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)
    statuses = {verb: fleetq(db_dsn, argv) for verb, argv in NOT_THERE.items()}
    assert statuses == dict.fromkeys(NOT_THERE, 65)


def test_each_works_on_a_migrated_database(db_dsn: str, sync_conn: SyncConnection) -> None:
    """The command lines above are ones that work: 0, or a verdict's 2 (never asked), or
    65 for the job or runner they name, which does not exist."""
    fleet.operations(sync_conn)
    statuses = {verb: fleetq(db_dsn, argv) for verb, argv in COMMANDS.items()}
    expected = {v: 65 if NOT_THERE.get(v) == COMMANDS[v] else 0 for v in COMMANDS}
    assert statuses == expected | {"result": 2}
