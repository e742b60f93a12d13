"""The runner's event loop (fleetq.runner.eventloop): uvloop's where it can serve on it,
asyncio's where a job user is set (uvloop cannot start a process as another user)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from fleetq.core.errors import ConfigError
from fleetq.runner import eventloop
from fleetq.runner.config import load
from fleetq.runner.main import main as runner_main

BASE: dict[str, object] = {"node": "n1", "lanes": {"checks": 1}}


def test_auto_serves_on_uvloop_unless_a_job_user_is_set() -> None:
    assert eventloop.choose(load(BASE, None)) == "uvloop"
    assert eventloop.choose(load({**BASE, "job_user": "nobody"}, None)) == "asyncio"
    assert eventloop.choose(load({**BASE, "loop": "asyncio"}, None)) == "asyncio"


def test_uvloop_with_a_job_user_is_refused_saying_why() -> None:
    with pytest.raises(ConfigError, match="uvloop cannot start a process as another user"):
        load({**BASE, "job_user": "nobody", "loop": "uvloop"}, None)


def test_uvloop_asked_for_but_not_installed_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eventloop, "available", lambda: False)
    with pytest.raises(ConfigError, match="uvloop is not installed"):
        eventloop.choose(load({**BASE, "loop": "uvloop"}, None))
    assert eventloop.choose(load(BASE, None)) == "asyncio"  # auto: falls back


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_the_chosen_loop_runs_the_runner_and_a_process(kind: eventloop.LoopKind) -> None:
    """A command job is a subprocess with a preexec_fn and a session of its own (as the
    executor starts it): both loops start and wait for one."""

    async def serve() -> int:
        assert eventloop.running() == kind
        proc = await asyncio.create_subprocess_exec(
            "sh", "-c", "exit 3", preexec_fn=os.getpid, start_new_session=True
        )
        return await proc.wait()

    assert eventloop.run(kind, serve()) == 3


def test_the_runner_command_takes_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def loop_would_start(kind: str, coro: object) -> int:
        coro.close()  # type: ignore[attr-defined]
        seen.append(kind)
        return 0

    monkeypatch.setattr("fleetq.runner.main.eventloop.run", loop_would_start)
    argv = ["--dsn", "postgresql://nowhere/x", "--node", "n1", "--lane", "checks=1"]
    argv += ["--work-dir", str(tmp_path)]
    assert runner_main(argv) == 0
    assert runner_main([*argv, "--loop", "asyncio"]) == 0
    assert seen == ["uvloop", "asyncio"]
