"""The built wheel carries its migrations and examples and can migrate on its own."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fleetq.core import migrate

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


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


def test_wheel_ships_migrations_examples_and_sql(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for m in migrate.discover():
        assert f"fleetq/migrations/{m.name}" in names
    assert "fleetq/examples/fleet.toml" in names
    assert "fleetq/core/sql/config.sql" in names


def test_installed_wheel_migrates_a_fresh_database(
    wheel: Path, tmp_path: Path, empty_dsn: str
) -> None:
    """Install the wheel into a new virtual environment (no checkout on its path) and
    migrate from there: the migrations must come from inside the installed package."""
    uv = shutil.which("uv")
    assert uv is not None, "uv is the project's installer; the README asks for it"
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "--quiet", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(python), str(wheel)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    where = subprocess.run(
        [python, "-c", "import fleetq.core.migrate as m; print(m.discover()[0].path)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert where.stdout.startswith(str(venv)), where.stdout
    fleetq = venv / "bin" / "fleetq"
    for args in (["migrate"], ["migrate", "--status"]):
        run = subprocess.run(
            [fleetq, "--dsn", empty_dsn, *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == 0, run.stderr
    assert "applied" in run.stdout and "pending" not in run.stdout
