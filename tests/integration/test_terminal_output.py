"""Issue 41, finding 9: no string from the database reaches a terminal raw.

Rows written before submit refused control characters still exist, and an administrator
can write anything: every free-text column a command can print is filled here with
terminal escapes (window title, clipboard, screen clear), CR/LF, C1 CSI, DEL and a
right-to-left override, straight in SQL. Then every command of the parser runs (a command
added later fails `test_every_command_is_exercised_or_exempt` until it is listed), and its
output, stdout and stderr, text and --json, must hold no control character but newline
and tab, and no line the data started (the marker after the CR/LF stays on its line).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from fleetq.cli.main import build_parser
from fleetq.core.db import SyncConnection
from tests import factories
from tests.integration.conftest import Cli

MARK = "INJECTED"
HOSTILE = (
    "x\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b[31mred\r\n"
    f"{MARK}\x9b1m\u202eevil\x08\x0b\x0c\x7f\u2028end"
)
# multi-line text (a job's output, a verdict's tail) keeps its newlines: its own lines
# are expected, so it carries no marker
OUTPUT = "collected 1 item\n" + HOSTILE.replace(MARK, "next") + "\nlast line\n"
# what must never reach a terminal raw: C0 but tab and newline, DEL, C1, the bidi
# controls, the Unicode line and paragraph separators
FORBIDDEN = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
# the marker follows "red" and a CR/LF in HOSTILE: shown on the line of that "red"
# (the break escaped, however it is spelled), never at the start of a line of its own
KEPT_ON_ITS_LINE = re.compile(rf"red.{{0,12}}{MARK}")
SHA = factories.SHA
RUNNER = "node-h/r1"

FLEET_FILE = """
[lanes.checks]
description = "checks"

[projects.tools]
repository = "/srv/git/tools.git"

[projects.tools.operations.lint]
lane = "checks"
command = "true"
"""


def _poison(conn: SyncConnection) -> dict[str, str]:
    """Every free-text column a command shows, holding HOSTILE; returns the ids to use."""
    runner = factories.runner(conn, "node-h", "r1", capabilities=("linux", HOSTILE))
    conn.execute(
        "UPDATE fleetq.runners SET state = 'draining', state_reason = $1, state_actor = $1, "
        "version = $1 WHERE id = $2",
        [HOSTILE, runner],
    )
    for sql in (
        "UPDATE fleetq.lanes SET description = $1 WHERE name = 'checks'",
        "UPDATE fleetq.projects SET description = $1, repository = $1 WHERE name = 'tools'",
        "UPDATE fleetq.operations SET command = $1 WHERE project = 'tools' AND name = 'lint'",
    ):
        conn.execute(sql.encode(), [HOSTILE])
    free: dict[str, Any] = {
        "requested_node": HOSTILE,
        "task_id": HOSTILE,
        "submitted_by": HOSTILE,
        "payload": {HOSTILE: HOSTILE, "note": HOSTILE},
    }
    queued = factories.job(
        conn, op=("webapp", "unit"), idempotency_key=HOSTILE, capabilities=[HOSTILE], **free
    )
    failed = factories.job(
        conn,
        op=("webapp", "unit"),
        state="failed",
        idempotency_key=HOSTILE + "2",
        failure_reason=HOSTILE,
        **free,
    )
    cancelled = factories.job(
        conn,
        op=("tools", "lint"),
        state="cancelled",
        cancel_reason=HOSTILE,
        cancelled_by=HOSTILE,
        **free,
    )
    conn.execute(
        "INSERT INTO fleetq.verdicts (project, commit_sha, operation, job_id, verdict, "
        "exit_code, reason, log_tail) VALUES ('webapp', $1, 'unit', $2, 'failed', 1, $3, $4)",
        [SHA, failed, HOSTILE, OUTPUT],
    )
    for token in (1, 2):
        conn.execute(
            "INSERT INTO fleetq.job_output (job_id, lease_version, seq, data) "
            "VALUES ($1, $2, 0, $3)",
            [failed, token, OUTPUT.encode()],
        )
        # two executions of one job that overlapped, on a node named by nobody's rule
        conn.execute(
            "INSERT INTO fleetq.executions (job_id, lease_version, runner_id, node, run_id, "
            "launched_at, ended_at) VALUES ($1, $2, $3, $4, gen_random_uuid(), "
            "clock_timestamp() - interval '60 seconds' + $2 * interval '10 seconds', "
            "clock_timestamp() - interval '5 seconds')",
            [failed, token, runner, HOSTILE],
        )
    for job in (queued, failed, cancelled):
        conn.execute(
            "INSERT INTO fleetq.events (kind, job_id, runner_id, lease_version, actor, detail) "
            "VALUES ('failed', $1, $2, 1, $2, $3)",
            [job, HOSTILE, Jsonb({"reason": HOSTILE, HOSTILE: [HOSTILE]})],
        )
    conn.execute(
        "INSERT INTO fleetq.schedules (name, cron, project, operation, branch, payload, "
        "paused_at, paused_by, paused_reason) VALUES ('hostile', '0 * * * *', 'tools', "
        "'lint', $1, $2, clock_timestamp(), $1, $1)",
        [HOSTILE, Jsonb({HOSTILE: HOSTILE})],
    )
    conn.execute(
        "INSERT INTO fleetq.api_tokens (name, kind, subject, token_sha256, created_by) "
        "VALUES ('hostile', 'reader', $1, sha256('x'), $1)",
        [HOSTILE],
    )
    conn.execute(
        "INSERT INTO fleetq.logins (role_name, kind, subject) VALUES ($1, 'reader', $1)",
        [HOSTILE],
    )
    return {"QUEUED": str(queued), "FAILED": str(failed), "RUNNER": runner}


# Each command of the parser, with the command lines that make it print what the
# database holds (placeholders: QUEUED, FAILED, RUNNER, FILE; HOSTILE is typed in too,
# where a name is an argument, since error messages quote it).
EXERCISED: dict[str, list[list[str]]] = {
    "migrate": [["migrate"], ["migrate", "--status"], ["migrate", "--status", "--json"]],
    "apply": [["apply", "--check", "FILE"]],
    "config show": [["config", "show"], ["config", "show", "--json"]],
    "config diff": [["config", "diff", "FILE"], ["config", "diff", "FILE", "--json"]],
    "config remove": [["config", "remove", "schedule", HOSTILE]],
    "submit": [["submit", "webapp", "unit", "--commit", SHA, "--key", HOSTILE]],
    "cancel": [["cancel", "QUEUED", "FAILED"], ["cancel", "QUEUED", "--json"]],
    "rerun": [["rerun", "FAILED"], ["rerun", "FAILED", "--json", "--key", HOSTILE]],
    "result": [
        ["result", "webapp", SHA],
        ["result", "webapp", SHA, "-v"],
        ["result", "tools", SHA],
        ["result", "webapp", SHA, "--json"],
    ],
    "jobs": [["jobs"], ["jobs", "--json"]],
    "explain": [["explain", "QUEUED"], ["explain", "FAILED"], ["explain", "QUEUED", "--json"]],
    "events": [["events"], ["events", "--job", "FAILED"], ["events", "--json"]],
    "reap": [["reap"]],
    "logs": [["logs", "FAILED"], ["logs", "FAILED", "--exit-status"]],
    "wait": [["wait", "FAILED", "QUEUED", "--timeout", "0"], ["wait", "FAILED", "--json"]],
    "runners": [["runners"], ["runners", "--json"]],
    "runners forget": [["runners", "forget", "RUNNER"], ["runners", "forget", HOSTILE]],
    "drain": [["drain", "RUNNER", "--reason", HOSTILE], ["drain", HOSTILE]],
    "pause": [["pause", "RUNNER"], ["pause", HOSTILE]],
    "resume": [["resume", "RUNNER"], ["resume", HOSTILE]],
    "schedules": [["schedules"], ["schedules", "--json"]],
    "schedules pause": [["schedules", "pause", "hostile", "--reason", HOSTILE]],
    "schedules resume": [["schedules", "resume", "hostile"], ["schedules", "resume", HOSTILE]],
    "overlaps": [["overlaps"], ["overlaps", "--json"]],
    "stats": [["stats"], ["stats", "--json"]],
    "prune": [["prune", "--before", "2000-01-01", "--dry-run"]],
    "roles add-runner": [["roles", "add-runner", HOSTILE]],
    "roles add-submitter": [["roles", "add-submitter", HOSTILE]],
    "roles add-operator": [["roles", "add-operator", HOSTILE]],
    "roles add-reader": [["roles", "add-reader", HOSTILE]],
    "roles add-gateway": [["roles", "add-gateway", HOSTILE]],
    "roles list": [["roles", "list"], ["roles", "list", "--json"]],
    "roles remove": [["roles", "remove", HOSTILE + "-gone"]],
    "tokens add": [["tokens", "add", "reader", HOSTILE, "--token-file", "-"]],
    "tokens list": [["tokens", "list"], ["tokens", "list", "--json"]],
    "tokens revoke": [["tokens", "revoke", HOSTILE]],
}
EXEMPT: dict[str, str] = {
    "demo": "builds its own fleet in its own database: no row of the given one is shown",
    "server status": "the embedded server's home, pid and DSN: no database row",
    "server start": "the embedded server's home, pid and DSN: no database row",
    "server stop": "one line saying whether it stopped",
    "api": "serves HTTP until stopped; prints its listen address (the API answers JSON)",
}


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> Iterator[str]:
    """Every command line verb path that runs something (`runners`, `runners forget`)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                path = f"{prefix} {name}".strip()
                if sub.get_default("func") is not None:
                    yield path
                yield from _commands(sub, path)


def test_every_command_is_exercised_or_exempt() -> None:
    commands = set(_commands(build_parser()))
    assert not set(EXERCISED) & set(EXEMPT)
    assert commands - set(EXERCISED) - set(EXEMPT) == set(), "a command nobody checked"
    assert set(EXERCISED) | set(EXEMPT) <= commands, "a listed command that is gone"


def _leaks(text: str) -> list[str]:
    """What in `text` would act on a terminal, or start a line the data made."""
    found = [f"raw {c!r}" for c in sorted(set(FORBIDDEN.findall(text)))]
    found += [f"line started by the data: {line!r}" for line in _injected_lines(text)]
    return found


def _injected_lines(text: str) -> list[str]:
    return [
        line for line in text.split("\n") if line.count(MARK) != len(KEPT_ON_ITS_LINE.findall(line))
    ]


@pytest.fixture
def hostile(sync_conn: SyncConnection, cli: Cli, tmp_path: Path) -> dict[str, str]:
    del cli  # its fixture registers the fleet's operations first
    ids = _poison(sync_conn)
    (tmp_path / "fleet.toml").write_text(FLEET_FILE)
    return {**ids, "FILE": str(tmp_path / "fleet.toml"), "HOSTILE": HOSTILE}


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(a, id=" ".join(a).replace(HOSTILE, "HOSTILE"))
        for c in EXERCISED.values()
        for a in c
    ],
)
def test_no_command_prints_the_databases_control_characters_raw(
    cli: Cli,
    hostile: dict[str, str],
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # a command that writes a file writes it here
    code, out, err = cli(*[hostile.get(a, a) for a in argv])
    assert code != 70, f"an internal error: {err}"
    assert out or err, "the command printed nothing: it checks nothing"
    for name, text in (("stdout", out), ("stderr", err)):
        leaks = _leaks(text)
        assert not leaks, f"{name}: {leaks}\n{text}"


def test_what_the_data_holds_is_shown_escaped_not_dropped(
    cli: Cli, hostile: dict[str, str]
) -> None:
    """The reader sees that something was there, and what: the escapes shown as text."""
    code, out, _ = cli("explain", hostile["QUEUED"])
    assert code == 0
    assert r"job asks for node x\x1b]0;pwned\x07\x1b]52;c;cHduZWQ=\x07" in out
    assert r"\r\nINJECTED\x9b1m\u202eevil\x08\x0b\x0c\x7f\u2028end" in out
    code, out, _ = cli("logs", hostile["FAILED"])
    assert code == 0
    # a multi-line output keeps its own line breaks, and escapes the rest
    assert "collected 1 item\nx\\x1b]0;pwned" in out and "\\u2028end\nlast line\n" in out
