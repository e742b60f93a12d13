"""Exit codes a CI gate can trust, and errors a person can read (issue 14). Each case was
wrong before: an unknown project answered 2 ("not yet": a gate waited for ever), a short
SHA 1 (the same as "failed"), `cancel 376 999999` hid that 376 was cancelled, and a
missing payload file, a deep JSON payload, a huge job id or a malformed DSN ended in a
traceback or a raw database error."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fleetq.cli.main import main as fleetq
from fleetq.core import fleet as fleet_api
from fleetq.core import leasing, producer, roles
from fleetq.core.db import SyncConnection, with_database
from fleetq.core.driver import Driver
from fleetq.core.models import Outcome, OutcomeReport, RunnerId, RunnerState
from tests import factories, fleet
from tests.fleet import SHA
from tests.integration.conftest import Cli, Login, login_dsn

EXAMPLE = Path(__file__).parents[2] / "examples" / "fleet.toml"


async def test_result_says_passed_failed_not_yet_and_never(cli: Cli, driver: Driver) -> None:
    run = cli
    assert run("result", "nosuch", SHA)[0] == 65  # an unknown project: never answered
    assert run("result", "tools", SHA, "--operation", "nosuch")[0] == 65
    code, _, err = run("result", "tools", SHA[:7])
    assert code == 64 and "40-character" in err  # a short SHA is a malformed request
    assert run("result", "tools", SHA)[0] == 2  # never asked: not yet
    await producer.submit(driver, project="tools", operation="lint", commit=SHA, submitted_by="a")
    assert run("result", "tools", SHA)[0] == 2  # queued: not yet
    runner = await fleet.runner(driver)
    (claim,) = await leasing.claim(driver, runner=runner, lane="checks", limit=1)
    report = OutcomeReport(
        job_id=claim.job_id, lease_version=claim.lease_version, outcome=Outcome.FAILED
    )
    await leasing.complete(driver, runner=runner, outcome=report)
    assert run("result", "tools", SHA)[0] == 1  # failed


async def test_cancel_reports_each_id(cli: Cli, driver: Driver) -> None:
    run = cli
    job = await producer.submit(
        driver, project="tools", operation="lint", commit=SHA, submitted_by="a"
    )
    code, out, err = run("cancel", str(job.job_id), "999999")
    assert code == 65
    assert f"job {job.job_id} cancelled" in out and "job 999999: no such job" in err


async def test_a_submitter_s_cancel_of_a_missing_job_is_not_found(
    login: Login, driver: Driver, capsys: pytest.CaptureFixture[str]
) -> None:
    """As its read says (65), not 77 "may cancel only its own jobs" (issue 42, item 9);
    another submitter's job is still refused."""
    bob = login(roles.Kind.SUBMITTER, "bob")
    theirs = await producer.submit(
        driver, project="tools", operation="lint", commit=SHA, submitted_by="alice"
    )
    with ThreadPoolExecutor(1) as pool:
        missing = pool.submit(fleetq, ["--dsn", bob, "cancel", "999999"]).result()
        other = pool.submit(fleetq, ["--dsn", bob, "cancel", str(theirs.job_id)]).result()
    err = capsys.readouterr().err
    assert (missing, other) == (65, 77), err
    assert "job 999999: no such job" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cancel", "99999999999999999999"], "is not a job id"),
        (["explain", "0"], "is not a job id"),
        (["jobs", "--limit", "-1"], "must be at least 1"),
        (["events", "--limit", "x"], "is not a whole number"),
        (["no-such-command"], "invalid choice"),
    ],
)
def test_usage_errors_exit_64(cli: Cli, argv: list[str], message: str) -> None:
    run = cli
    code, _, err = run(*argv)
    assert code == 64 and message in err and "Traceback" not in err, err


def test_payload_files_that_cannot_be_read_say_why(cli: Cli, tmp_path: Path) -> None:
    run = cli
    (tmp_path / "latin1.json").write_bytes(b'{"name": "\xe9"}')
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    for name, message in (
        ("missing.json", "no such file"),
        (".", "is a directory"),
        ("latin1.json", "not UTF-8 text"),
        ("deep.json", "nests too deeply"),
    ):
        code, _, err = run(
            "submit", "tools", "lint", "--commit", SHA, "--payload-file", str(tmp_path / name)
        )
        assert code == 64 and message in err and "Traceback" not in err, (name, err)


def test_a_malformed_dsn_is_a_configuration_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = fleetq(["--dsn", "postgresql://u:hunter2@localhost:notaport/x", "jobs"])
    err = capsys.readouterr().err
    assert code == 78 and "port 'notaport' is not a number" in err and "hunter2" not in err


async def test_untrusted_text_is_shown_escaped(cli: Cli, driver: Driver, tmp_path: Path) -> None:
    """A drain reason with ESC sequences was echoed raw by `fleetq runners`; config
    errors echoed raw ESC/BEL from names."""
    run = cli
    runner = await fleet.runner(driver)
    await fleet_api.set_state(
        driver,
        runner=RunnerId(runner),
        state=RunnerState.DRAINING,
        reason="\x1b]0;owned\x07\x1b[2Jgone",
        actor="ops",
    )
    code, out, _ = run("runners")
    assert code == 0 and "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;owned\\x07\\x1b[2Jgone" in out, out
    bad = tmp_path / "fleet.toml"
    bad.write_text('[lanes."ch\\u001b[31mecks\\u0007"]\n')
    code, _, err = run("apply", str(bad))
    assert code == 78 and "\x1b" not in err and "\x07" not in err and "\\x1b" in err, err


def test_interrupted_submit_says_what_may_have_happened(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during submit printed a KeyboardInterrupt traceback; now it says whether
    the job may have been queued and how to find out."""
    run = cli

    async def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(producer, "submit", interrupted)
    code, _, err = run("submit", "tools", "lint", "--commit", SHA, "--key", "k1")
    assert code == 130 and "may or may not have been queued" in err and "--key k1" in err, err
    assert "Traceback" not in err


def test_an_unexpected_error_is_one_line_exit_70(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    run = cli

    async def broken(*_: object, **__: object) -> None:
        raise RuntimeError("something fleetq did not expect")

    monkeypatch.setattr(producer, "submit", broken)
    code, _, err = run("submit", "tools", "lint", "--commit", SHA)
    assert code == 70 and "internal error: RuntimeError" in err and "Traceback" not in err


def test_submit_warns_when_no_runner_could_ever_run_the_job(
    cli: Cli, sync_conn: SyncConnection
) -> None:
    """A job needing a capability nobody has waited with no sign why (issue 14); `explain`
    says so too, and says when a job is finished."""
    factories.runner(sync_conn, lanes={"checks": 2})  # no "browser" capability
    code, out, err = cli("submit", "webapp", "browser", "--commit", SHA)
    assert code == 0 and "queued" in out
    assert "no registered runner could ever run job 1" in err and "missing capability" in err
    code, out, err = cli("submit", "tools", "lint", "--commit", SHA)
    assert code == 0 and "warning" not in err, err  # one a runner can run: no warning
    code, out, _ = cli("explain", "1")
    assert "could ever run it" in out
    cli("cancel", "1")
    code, out, _ = cli("explain", "1")
    assert code == 0 and out.startswith("job 1 is finished (cancelled)")


def test_a_submitter_login_is_warned_and_told_why_too(
    login: Login, sync_conn: SyncConnection, capsys: pytest.CaptureFixture[str]
) -> None:
    """A submitter's login may not read the runner tables, so its submit warned of
    nothing and its `explain` was refused (issue 42, item 9): fleetq.explain_jobs answers
    it the runners' verdicts for its job."""
    factories.runner(sync_conn, lanes={"checks": 2})  # no "browser" capability
    ci = login(roles.Kind.SUBMITTER, "ci")
    with ThreadPoolExecutor(1) as pool:
        submitted = pool.submit(
            fleetq, ["--dsn", ci, "submit", "webapp", "browser", "--commit", SHA]
        ).result()
        submit_err = capsys.readouterr().err
        explained = pool.submit(fleetq, ["--dsn", ci, "explain", "1"]).result()
    out = capsys.readouterr().out
    assert submitted == 0 and "no registered runner could ever run job 1" in submit_err
    assert explained == 0 and "missing capability browser" in out, out


def test_config_show_gives_back_a_file_that_changes_nothing(cli: Cli, tmp_path: Path) -> None:
    """`fleetq config show` (issue 14): the configuration as the database has it, as a
    file `fleetq apply` takes back unchanged."""
    assert cli("apply", str(EXAMPLE))[0] == 0
    code, shown, _ = cli("config", "show")
    assert code == 0 and "[projects.webapp.operations.unit.limits]" in shown
    path = tmp_path / "shown.toml"
    path.write_text(shown)
    code, out, _ = cli("config", "diff", str(path))
    assert (code, out.strip()) == (0, "(nothing would change)")
    code, out, _ = cli("apply", str(path))
    assert code == 0 and "changed nothing" in out, out


def test_diff_and_check_see_schedules(cli: Cli, tmp_path: Path) -> None:
    """`config diff` and `apply --check` said "nothing would change" when a schedule was
    added or changed, and `apply` then changed it (issue 42, finding 6)."""
    assert cli("apply", str(EXAMPLE))[0] == 0
    nightly = (
        '[schedules.nightly]\ncron = "0 3 * * *"\nproject = "tools"\noperation = "lint"\n'
        'branch = "main"\n'
    )
    path = tmp_path / "schedule.toml"
    path.write_text(nightly)
    code, out, _ = cli("config", "diff", str(path))
    assert code == 0 and "+ schedules.nightly (new)" in out and "nothing" not in out, out
    code, out, _ = cli("apply", "--check", str(path))
    assert code == 0 and "+ schedules.nightly (new)" in out, out
    assert cli("apply", str(path))[0] == 0
    changed = tmp_path / "changed.toml"
    changed.write_text(nightly.replace("0 3", "30 4") + 'catch_up = "all"\n')
    code, out, _ = cli("config", "diff", str(changed))
    assert "~ schedules.nightly.cron: '0 3 * * *' -> '30 4 * * *'" in out, out
    assert "~ schedules.nightly.catch_up: 'last' -> 'all'" in out, out
    assert cli("apply", str(changed))[0] == 0
    code, out, _ = cli("config", "diff", str(path))  # catch_up left out: reset
    assert "! schedules.nightly.catch_up: not in the file, so reset from 'all'" in out, out
    code, out, _ = cli("config", "diff", str(changed))
    assert "schedules.nightly." not in out, out  # applied: nothing of it would change
    code, shown, _ = cli("config", "show")
    assert "[schedules.nightly]" in shown
    (tmp_path / "shown.toml").write_text(shown)
    code, out, _ = cli("config", "diff", str(tmp_path / "shown.toml"))
    assert (code, out.strip()) == (0, "(nothing would change)"), out


def test_a_partial_file_says_what_it_resets_and_check_asks_the_database(
    cli: Cli, tmp_path: Path
) -> None:
    """Applying a partial file wiped a lane's description silently, and `apply --check`
    passed a lane the database does not have (then `apply` failed)."""
    assert cli("apply", str(EXAMPLE))[0] == 0
    partial = tmp_path / "partial.toml"
    partial.write_text('[lanes.checks]\n[lanes.gpu]\ndescription = "GPUs"\n')
    code, out, _ = cli("config", "diff", str(partial))
    assert code == 0
    assert "! lanes.checks.description: not in the file, so reset from" in out
    assert "+ lanes.gpu (new)" in out and "= projects.webapp:" in out
    code, _, err = cli("apply", str(partial))
    assert code == 0 and "warning: ! lanes.checks.description" in err, err
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[projects.x]\nrepository = "/r"\n[projects.x.operations.o]\nlane = "nope"\n'
        'command = "true"\n'
    )
    code, _, err = cli("apply", "--check", str(bad))
    assert code == 78 and "unknown lane 'nope'" in err, err


def test_a_dsn_naming_what_the_server_lacks_is_a_configuration_error(cli: Cli, db_dsn: str) -> None:
    """A DSN naming a missing database exited 69 ("unreachable, try again"), as if waiting
    would help (issue 42, finding 8); it is the DSN that is wrong: 78. Both drivers."""
    missing_db = with_database(db_dsn, "fleetq_no_such_database")
    no_role = login_dsn(db_dsn, "fleetq_no_such_role")
    for dsn in (missing_db, no_role):
        for verb in (("jobs",), ("logs", "1")):  # asyncpg / psycopg underneath
            code, _, err = cli(*verb, "--dsn", dsn)
            assert code == 78 and "does not exist" in err, (verb, code, err)


def test_logs_of_a_token_the_job_never_had_is_not_found(
    cli: Cli, sync_conn: SyncConnection
) -> None:
    """`fleetq logs JOB --token 99` printed nothing and exited 0 (issue 42, finding 8)."""
    assert cli("submit", "tools", "lint", "--commit", SHA)[0] == 0
    code, _, err = cli("logs", "1", "--token", "99")
    assert code == 65 and "never ran under token 99" in err, err


@pytest.mark.parametrize("after_s", [0.05, 0.15, 0.3, 0.5])
def test_ctrl_c_while_the_command_loads_exits_130_without_a_traceback(
    db_dsn: str, after_s: float
) -> None:
    """Ctrl-C in a command's first second (while its modules load) printed a
    KeyboardInterrupt traceback (issue 42, finding 8). Whenever it lands: 130, or the
    signal's own end before Python handles it, and never a traceback."""
    delay = after_s
    for _ in range(20):
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetq", "--dsn", db_dsn, "jobs"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            proc.wait(timeout=delay)  # the Ctrl-C lands while it loads, or after it ended
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        # on a loaded machine the signal can land while the interpreter itself starts,
        # before any of fleetq runs (Python's own "Fatal Python error"), or while it
        # imports the entry point's module, before its first function has run: nothing
        # can own SIGINT before that. Try again, a little later each time (CI's loaded
        # machine landed all five tries at 0.05 s before fleetq's first function)
        if "init_import_site" not in err and not _before_any_function(err):
            break
        delay += 0.02
    else:
        pytest.fail(f"every Ctrl-C up to {delay:.2f} s landed before fleetq ran: {err}")
    assert proc.returncode in (0, 130, -signal.SIGINT), (proc.returncode, err)
    assert "Traceback" not in err, err


def _before_any_function(err: str) -> bool:
    """A KeyboardInterrupt raised while modules were only being imported: every frame of
    fleetq's own in its traceback is a module's top level, so no function of fleetq had
    run yet (the standard library's may have: `import signal` builds its enums). No frame
    of fleetq at all: runpy was still looking for the module."""
    frames = re.findall(r'^  File "([^"]*)", line \d+, in (.+)$', err, re.MULTILINE)
    ours = [name for path, name in frames if Path(path).is_relative_to(_PACKAGE)]
    return "KeyboardInterrupt" in err and all(n == "<module>" for n in ours)


_PACKAGE = Path(fleet_api.__file__).resolve().parents[1]  # fleetq/, from fleetq/core/fleet.py


def test_ctrl_c_inside_an_import_exits_130_without_a_traceback() -> None:
    """A KeyboardInterrupt raised inside an import can surface as a RuntimeError (from
    `__set_name__`) or as importlib's "Exception ignored" traceback, which no `except
    KeyboardInterrupt` catches (1 run in 20 at 0.05 s). While the command loads, SIGINT
    ends the process at once instead; once loaded it is a KeyboardInterrupt again."""
    script = (
        "import os, signal\n"
        "from fleetq.cli import entry\n"
        "entry.loading()\n"
        "entry.loaded()\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "except KeyboardInterrupt:\n"
        "    print('handled by the command')\n"
        "entry.loading()\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "import json\n"
        "print('not reached')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.stdout == "handled by the command\n", done.stdout
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert done.stderr == "fleetq: interrupted\n", done.stderr


def test_version_answers_without_loading_the_commands() -> None:
    """`fleetq --version` paid the whole command line's import for one line."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fleetq", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip().startswith("fleetq ")
    loaded = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert not {"psycopg", "pydantic", "fleetq.cli.main"} & loaded, sorted(loaded)


def test_submit_from_file_warns_for_the_lines_no_runner_could_ever_run(
    cli: Cli, sync_conn: SyncConnection, tmp_path: Path
) -> None:
    """Found driving: `submit --from-file` of 2,000 jobs, some asking for a node no runner
    is on, said only "2000 job(s) queued"; one submit of such a job warns. One check per
    operation and node, naming the file's lines."""
    factories.runner(sync_conn, lanes={"checks": 2})  # no "browser" capability
    jobs = tmp_path / "jobs.jsonl"
    lines = [
        {"project": "webapp", "operation": "browser", "commit": SHA},
        {"project": "tools", "operation": "lint", "commit": SHA},
        {"project": "webapp", "operation": "browser", "commit": SHA, "payload": {"n": 2}},
    ]
    jobs.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, out, err = cli("submit", "--from-file", str(jobs))
    assert code == 0 and "3 job(s) queued" in out
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: lines 1, 3 of {jobs}:")
    assert "missing capability" in warnings[0]
