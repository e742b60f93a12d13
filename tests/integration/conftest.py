"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from fleetq.cli.main import main as fleetq
from fleetq.core.db import SyncConnection
from tests import fleet

Run = tuple[int, str, str]
Cli = Callable[..., Run]  # fleetq ARGS... -> (exit status, stdout, stderr)


@pytest.fixture
def cli(db_dsn: str, sync_conn: SyncConnection, capsys: pytest.CaptureFixture[str]) -> Cli:
    fleet.operations(sync_conn)

    def command(argv: list[str]) -> int:
        try:
            return fleetq(["--dsn", db_dsn, *argv])
        except SystemExit as exc:  # argparse's usage errors
            return int(exc.code or 0)

    def run(*argv: str) -> Run:
        # a thread of its own: the CLI runs its own event loop, and async tests have one
        with ThreadPoolExecutor(1) as pool:
            code = pool.submit(command, list(argv)).result()
        out, err = capsys.readouterr()
        return code, out, err

    return run
