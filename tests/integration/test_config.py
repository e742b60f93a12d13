"""`fleetq apply`: validated whole, written in one transaction, errors that say where."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleetq.core import config
from fleetq.core.db import SyncConnection, connect
from fleetq.core.errors import ConfigError
from fleetq.core.resources import shipped_dir

EXAMPLE = shipped_dir("examples") / "fleet.toml"

GOOD = """
[lanes.checks]
[projects.web]
repository = "repos/web"
[projects.web.operations.unit]
lane = "checks"
command = "pytest"
cpus = 1.5
"""


def _write(tmp_path: Path, text: str, name: str = "fleet.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _counts(conn: SyncConnection) -> dict[str, int]:
    tables = ["lanes", "projects", "operations", "identities"]
    return {
        t: int(conn.execute(f"SELECT count(*) FROM fleetq.{t}".encode()).fetchone()[0])  # type: ignore[index]
        for t in tables
    }


def test_example_applies_and_reapplying_changes_nothing(tx: SyncConnection) -> None:
    first = config.apply(tx, config.load(EXAMPLE), source=EXAMPLE)
    assert first.totals == {
        "lanes": 2,
        "projects": 2,
        "operations": 4,
        "identities": 2,
        "schedules": 0,
    }
    assert first.changed["settings"] == 0  # the example restates the defaults
    again = config.apply(tx, config.load(EXAMPLE), source=EXAMPLE)
    assert set(again.changed.values()) == {0}


def test_requirements_are_stored_in_database_units(tx: SyncConnection, tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    config.apply(tx, config.load(path), source=path)
    ops = config.operations(tx)
    assert [(o.name, o.cpu_millis, o.runs) for o in ops] == [("unit", 1500, "pytest")]
    row = tx.execute("SELECT repository FROM fleetq.projects WHERE name = 'web'").fetchone()
    assert row == (str(tmp_path / "repos" / "web"),)  # relative to the file


def test_settings_are_written_as_json(tx: SyncConnection, tmp_path: Path) -> None:
    path = _write(tmp_path, "[settings]\nlease_seconds = 12\nreassignment_cap = 2\n")
    assert config.apply(tx, config.load(path), source=path).changed["settings"] == 2
    row = tx.execute("SELECT value FROM fleetq.settings WHERE name = 'lease_seconds'").fetchone()
    assert row == (12,)


def test_updates_are_upserts(tx: SyncConnection, tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    config.apply(tx, config.load(path), source=path)
    changed = _write(tmp_path, GOOD.replace("cpus = 1.5", "cpus = 2"))
    summary = config.apply(tx, config.load(changed), source=changed)
    assert summary.changed["operations"] == 1 and summary.changed["projects"] == 0
    assert config.operations(tx)[0].cpu_millis == 2000


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            GOOD + "colour = 'blue'\n",
            "fleet.toml: projects.web.operations.unit.colour: unknown field",
        ),
        (
            GOOD.replace('command = "pytest"', 'handler = "x:y"\ncommand = "pytest"'),
            "projects.web.operations.unit: give exactly one of `command` or `handler`",
        ),
        (
            GOOD.replace("cpus = 1.5", "cpus = -1"),
            "projects.web.operations.unit.cpus: Input should be greater than or equal to 0",
        ),
        (GOOD.replace("[lanes.checks]", "[lanes.Checks]"), "lanes.Checks.[key]"),
        (GOOD + "[identities.bot]\nrole = 'king'\n", "identities.bot.role: Input should be"),
        ("[lanes.checks\n", "fleet.toml: not valid TOML"),
        (GOOD.replace('repository = "repos/web"', ""), "projects.web.repository: Field required"),
        (
            GOOD + "[projects.web.operations.unit.limits]\noutput_mb = 0\n",
            "projects.web.operations.unit.limits.output_mb: Input should be greater than",
        ),
        (
            GOOD + "[projects.web.operations.unit.limits]\nwall = 3\n",
            "projects.web.operations.unit.limits.wall: unknown field",
        ),
    ],
)
def test_bad_files_say_where(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config.load(_write(tmp_path, text))
    assert message in str(caught.value)
    assert str(tmp_path / "fleet.toml") in str(caught.value)


def test_unknown_lane_is_refused_and_nothing_is_written(tx: SyncConnection, tmp_path: Path) -> None:
    before = _counts(tx)
    text = (
        GOOD + '[projects.api]\nrepository = "/r"\n[projects.api.operations.x]\n'
        'lane = "chekcs"\ncommand = "true"\n'
    )
    path = _write(tmp_path, text)
    with pytest.raises(
        ConfigError,
        match=r"projects\.api\.operations\.x\.lane: unknown lane 'chekcs' "
        r"\(known: checks\)",
    ):
        config.apply(tx, config.load(path), source=path)
    assert _counts(tx) == before


def test_a_database_failure_midway_writes_nothing(db_dsn: str, tmp_path: Path) -> None:
    """The last operation fails inside the database (a trigger stands in for any DB-side
    refusal); the lanes and projects upserted before it must be rolled back too."""
    with connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            b"CREATE FUNCTION fleetq.test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
            b"$$ BEGIN RAISE EXCEPTION 'refused by test'; END $$;"
            b"CREATE TRIGGER refuse BEFORE INSERT ON fleetq.operations FOR EACH ROW "
            b"WHEN (NEW.name = 'zzz') EXECUTE FUNCTION fleetq.test_refuse();"
        )
        text = GOOD + '[projects.web.operations.zzz]\nlane = "checks"\ncommand = "x"\n'
        path = _write(tmp_path, text)
        with pytest.raises(Exception, match="refused by test"):
            config.apply(conn, config.load(path), source=path)
        assert _counts(conn) == {"lanes": 0, "projects": 0, "operations": 0, "identities": 0}


def test_cli_apply_reports_errors_and_exits_78(db_dsn: str, tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace('lane = "checks"', 'lane = "nope"'))
    run = subprocess.run(
        [sys.executable, "-m", "fleetq", "--dsn", db_dsn, "apply", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 78
    assert "fleetq: error:" in run.stderr and "unknown lane 'nope'" in run.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "fleetq", "--dsn", db_dsn, "apply", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert "fleet now has 2 lanes, 2 projects, 4 operations, 2 identities" in ok.stdout


def test_cli_apply_refuses_an_unmigrated_database(empty_dsn: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "fleetq", "--dsn", empty_dsn, "apply", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 78
    assert "run `fleetq migrate`" in run.stderr


@pytest.mark.parametrize("name", ["lease_seconds", "runner_offline_after_seconds"])
def test_a_setting_too_short_for_renewals_is_refused(tmp_path: Path, name: str) -> None:
    """`lease_seconds = 1` made every execution fence itself at once (36 in 10 s)."""
    path = _write(tmp_path, f"[settings]\n{name} = 1\n")
    with pytest.raises(ConfigError, match="at least 3 seconds"):
        config.load(path)


@pytest.mark.parametrize(
    ("command", "message"),
    [("sh -c 'echo unclosed", "cannot be split into words"), ("   ", "names no program")],
)
def test_a_command_that_cannot_run_is_refused_at_apply(
    tmp_path: Path, command: str, message: str
) -> None:
    """It passed `apply` and failed every job it was given, inside the runner."""
    path = _write(
        tmp_path,
        '[lanes.checks]\n[projects.p]\nrepository = "/r"\n'
        f'[projects.p.operations.o]\nlane = "checks"\ncommand = {command!r}\n',
    )
    with pytest.raises(ConfigError, match=message):
        config.load(path)
