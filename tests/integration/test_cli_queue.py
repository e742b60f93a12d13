"""The queue commands as an operator types them (in-process, real database)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetq.cli.main import main
from fleetq.core.db import SyncConnection
from tests import factories, fleet
from tests.fleet import SHA

Invoke = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(
    db_dsn: str,
    sync_conn: SyncConnection,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Invoke:
    fleet.operations(sync_conn)
    monkeypatch.setenv("FLEETQ_ACTOR", "operator-ann")

    def invoke(*args: str) -> tuple[int, str, str]:
        code = main(["--dsn", db_dsn, *args])
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


def test_submit_twice_with_a_key_and_read_back(cli: Invoke) -> None:
    code, out, _ = cli(
        "submit", "tools", "lint", "--commit", SHA, "--key", "k1", "--payload", '{"n": 1}'
    )
    assert (code, out.strip()) == (0, "job 1 queued (priority class 2)")
    code, out, _ = cli(
        "submit", "tools", "lint", "--commit", SHA, "--key", "k1", "--payload", '{"n": 1}', "--json"
    )
    answer = json.loads(out)
    assert (code, answer["job_id"], answer["created"]) == (0, 1, False)
    code, out, _ = cli("jobs", "--json")
    (job,) = json.loads(out)
    assert (job["id"], job["state"], job["submitted_by"]) == (1, "queued", "operator-ann")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--commit", "abc"], "full 40-character hex SHA"),
        (["--commit", SHA, "--payload", "{nope"], "payload is not valid JSON"),
        (["--commit", SHA, "--payload", "[1]"], "payload must be a JSON object"),
    ],
)
def test_submit_refuses_bad_input_with_exit_64(cli: Invoke, args: list[str], message: str) -> None:
    code, _, err = cli("submit", "tools", "lint", *args)
    assert code == 64 and message in err and err.startswith("fleetq: error:")


def test_result_exit_codes_follow_the_verdict(cli: Invoke, sync_conn: SyncConnection) -> None:
    code, out, _ = cli("result", "tools", SHA)
    assert code == 2 and "nothing was ever asked" in out
    cli("submit", "tools", "lint", "--commit", SHA)
    code, out, _ = cli("result", "tools", SHA, "--json")
    assert code == 2 and json.loads(out)[0]["status"] == "live"
    cli("cancel", "1")
    code, out, _ = cli("result", "tools", SHA)
    assert code == 2 and "cancelled" in out  # a cancel decides nothing (issue 42)


def test_cancel_drain_and_explain(cli: Invoke, sync_conn: SyncConnection) -> None:
    runner = factories.runner(sync_conn, lanes={"checks": 1})
    cli("submit", "webapp", "browser", "--commit", SHA)
    code, out, _ = cli("explain", "1")
    assert code == 0
    assert out.splitlines()[0] == "0/1 runners eligible: 1 missing capability browser"
    code, out, _ = cli("drain", runner, "--reason", "kernel upgrade")
    assert (code, out.strip()) == (0, f"runner {runner} is now drained")
    code, out, _ = cli("runners", "--json")
    (r,) = json.loads(out)
    assert (r["state"], r["state_reason"], r["state_actor"]) == (
        "drained",
        "kernel upgrade",
        "operator-ann",
    )
    code, out, _ = cli("resume", runner)
    assert out.strip() == f"runner {runner} is now active"
    code, out, _ = cli("cancel", "1", "1")
    assert out.splitlines() == [
        "job 1 cancelled (was queued)",
        "job 1 was already cancelled: nothing to cancel",
    ]
    code, out, _ = cli("events", "--job", "1", "--json")
    assert [e["kind"] for e in json.loads(out)] == ["submitted", "cancelled"]


def test_unknown_job_and_runner_are_clear_errors(cli: Invoke) -> None:
    assert cli("explain", "99")[2].strip() == "fleetq: error: no job 99"
    code, _, err = cli("pause", "no/such")
    assert code == 65 and "unknown runner no/such" in err


def test_queue_commands_refuse_an_unmigrated_database(
    empty_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--dsn", empty_dsn, "jobs"]) == 78
    assert "run `fleetq migrate`" in capsys.readouterr().err


def test_submit_after_waits_explains_and_cancels_down_the_chain(cli: Invoke) -> None:
    cli("submit", "tools", "lint", "--commit", SHA)
    code, out, _ = cli("submit", "tools", "lint", "--commit", SHA, "--after", "1")
    assert (code, out.strip()) == (
        0,
        "job 2 waiting on 1 (priority class 2); queued when they have succeeded",
    )
    code, out, _ = cli("explain", "2")
    assert code == 0 and "job 2 is waiting on 1: no runner takes it" in out
    code, out, _ = cli("jobs", "--json")
    waiting = {j["id"]: j["waiting_on"] for j in json.loads(out)}
    assert waiting == {1: [], 2: [1]}
    code, out, _ = cli("cancel", "1")
    assert code == 0
    code, out, _ = cli("jobs", "--json")
    second = next(j for j in json.loads(out) if j["id"] == 2)
    assert (second["state"], second["cancel_reason"]) == (
        "cancelled",
        "dependency failed: job 1 cancelled",
    )
    code, out, _ = cli("submit", "tools", "lint", "--commit", SHA, "--after", "1")
    assert (code, out.strip()) == (0, "job 3 cancelled at once: dependency failed: job 1 cancelled")
    code, _, err = cli("submit", "tools", "lint", "--commit", SHA, "--after", "77")
    assert code == 65 and "no job 77 to wait for" in err


def test_submit_carries_a_trace_from_the_flag_or_the_environment(
    cli: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    cli("submit", "tools", "lint", "--commit", SHA, "--traceparent", trace)
    monkeypatch.setenv("TRACEPARENT", trace.replace("01", "00", 1)[:-2] + "01")
    cli("submit", "tools", "lint", "--commit", SHA)
    monkeypatch.setenv("TRACEPARENT", "garbage")
    code, _, err = cli("submit", "tools", "lint", "--commit", SHA)
    assert code == 0 and "ignoring $TRACEPARENT" in err  # inherited: warned, not refused
    code, _, err = cli("submit", "tools", "lint", "--commit", SHA, "--traceparent", "garbage")
    assert code == 64 and "W3C trace context" in err  # given: refused
    code, out, _ = cli("jobs", "--json")
    traces = {j["id"]: j["traceparent"] for j in json.loads(out)}
    assert traces[1] == trace and traces[2] is not None and traces[3] is None


def test_schedules_are_listed_paused_with_a_reason_and_resumed(
    cli: Invoke, sync_conn: SyncConnection, tmp_path: Path
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(
        '[schedules.nightly]\ncron = "0 3 * * *"\ntimezone = "Europe/Berlin"\n'
        f'project = "tools"\noperation = "lint"\ncommit = "{SHA}"\n'
    )
    code, _, err = cli("apply", str(path))
    assert code == 0, err
    code, out, _ = cli("schedules")
    assert code == 0 and "nightly" in out and "0 3 * * * (Europe/Berlin)" in out
    code, _, err = cli("schedules", "pause", "nightly", "--reason", "")
    assert code == 64 and "takes a reason" in err
    code, out, _ = cli("schedules", "pause", "nightly", "--reason", "repo moving")
    assert (code, out.strip()) == (0, "schedule nightly paused")
    code, out, _ = cli("schedules", "--json")
    (listed,) = json.loads(out)
    assert (listed["paused_reason"], listed["next_tick"]) == ("repo moving", None)
    code, out, _ = cli("schedules", "resume", "nightly")
    assert (code, out.strip()) == (0, "schedule nightly resumed")
    code, _, err = cli("schedules", "pause", "nope", "--reason", "x")
    assert code != 0 and "no schedule nope" in err
    code, out, _ = cli("config", "remove", "schedule", "nightly")
    assert (code, out.strip()) == (0, "schedule nightly removed; the jobs it fired stay")
    code, _, err = cli("config", "remove", "schedule", "nightly")
    assert code != 0 and "no schedule nightly" in err
