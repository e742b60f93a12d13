"""The executor returns what happened as a value, and leaves no process behind."""

from __future__ import annotations

import asyncio
import math
import os
import time
from datetime import datetime
from pathlib import Path

import pytest

from fleetq.core.errors import StaleLease
from fleetq.core.models import Outcome
from fleetq.runner import deadlines, executor, handling, stalls


class Stop:
    """A stand-in for an Execution's stop request."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.hook: object = None

    def on_stop(self, hook: object) -> object:
        self.hook = hook
        return lambda: None

    def request(self) -> None:
        self.stop.set()
        if callable(self.hook):
            self.hook()


async def _run(
    command: str, tmp_path: Path, *, timeout_s: float = 30, stop: asyncio.Event | None = None
) -> tuple[executor.Finished, list[int]]:
    started: list[int] = []

    async def on_start(pid: int, _at: datetime) -> None:
        started.append(pid)

    finished = await executor.run_command(
        command,
        cwd=tmp_path,
        env=executor.job_environment({"FLEETQ_RUN_ID": "r-test"}),
        timeout_s=timeout_s,
        log_path=tmp_path / "logs" / "job.log",
        on_start=on_start,
        stop=stop or asyncio.Event(),
    )
    return finished, started


async def test_exit_codes_become_outcomes(tmp_path: Path) -> None:
    ok, _ = await _run("sh -c 'echo hello; exit 0'", tmp_path)
    assert (ok.outcome, ok.exit_code, ok.log_tail) == (Outcome.SUCCEEDED, 0, "hello\n")
    bad, _ = await _run("sh -c 'echo oops >&2; exit 3'", tmp_path)
    assert (bad.outcome, bad.exit_code, bad.reason, bad.log_tail) == (
        Outcome.FAILED,
        3,
        "exit",
        "oops\n",
    )


async def test_a_missing_program_fails_saying_why(tmp_path: Path) -> None:
    """It ended as "failed, reason launch" with an empty log: now the reason and the
    job's log both say which program and which error."""
    finished, started = await _run("no-such-program-anywhere", tmp_path)
    assert (finished.outcome, started) == (Outcome.FAILED, [])
    assert finished.reason == (
        "launch failed: cannot run no-such-program-anywhere: No such file or directory (ENOENT)"
    )
    log = (tmp_path / "logs" / "job.log").read_text()
    assert "No such file or directory (ENOENT)" in log


async def test_a_command_that_cannot_be_split_fails_saying_why(tmp_path: Path) -> None:
    """It raised inside the runner: a traceback, no outcome, a slot held until the job
    failed as reassignments_exhausted."""
    finished, started = await _run("sh -c 'echo unclosed", tmp_path)
    assert (finished.outcome, started) == (Outcome.FAILED, [])
    assert finished.reason == (
        "launch failed: the command cannot be split into words (No closing quotation)"
    )


async def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    finished, (pid,) = await _run("sh -c 'sleep 300 & sleep 300'", tmp_path, timeout_s=0.3)
    assert (finished.outcome, finished.reason) == (Outcome.FAILED, "timeout")
    assert executor.group_members(pid) == []


async def _stop_once_launched(tmp_path: Path) -> executor.Finished:
    """Run `sleep 300`, ask it to stop as soon as it has started, return what happened."""
    stop, launched = asyncio.Event(), asyncio.Event()

    async def on_start(_pid: int, _at: datetime) -> None:
        launched.set()

    task = asyncio.ensure_future(
        executor.run_command(
            "sleep 300",
            cwd=tmp_path,
            env=executor.job_environment({}),
            timeout_s=300,
            log_path=tmp_path / "job.log",
            on_start=on_start,
            stop=stop,
        )
    )
    await launched.wait()
    stop.set()
    return await task


async def test_stop_request_stops_without_an_outcome(tmp_path: Path) -> None:
    finished = await _stop_once_launched(tmp_path)
    assert (finished.outcome, finished.reason, finished.signal) == (None, "stopped", 15)


async def test_the_environment_is_allow_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETQ_DSN", "postgresql://secret@db/fleetq")
    monkeypatch.setenv("PGPASSWORD", "hunter2")
    finished, _ = await _run("env", tmp_path)
    assert "hunter2" not in finished.log_tail and "secret" not in finished.log_tail
    assert "FLEETQ_RUN_ID=r-test" in finished.log_tail
    assert f"PATH={os.environ['PATH']}" in finished.log_tail


async def test_handler_outcomes(tmp_path: Path) -> None:
    async def ok(_ctx: object) -> str:
        return "fine"

    async def boom(_ctx: object) -> None:
        raise ValueError("bad input")

    async def stale(_ctx: object) -> None:
        raise StaleLease(1, 2)

    async def slow(_ctx: object) -> None:
        await asyncio.sleep(300)

    async def outcome(fn: object, timeout_s: float = 5) -> executor.Finished:
        return await handling.run_handler(fn, None, timeout_s=timeout_s, stoppable=Stop())  # type: ignore[arg-type]

    assert (await outcome(ok)).log_tail == "fine"
    failed = await outcome(boom)
    assert (failed.outcome, failed.reason) == (Outcome.FAILED, "exception")
    assert "ValueError: bad input" in failed.log_tail
    assert (await outcome(stale)).outcome is None
    timed = await outcome(slow, timeout_s=0.05)
    assert (timed.outcome, timed.reason) == (Outcome.FAILED, "timeout")


async def test_a_stop_cancels_a_running_handler(tmp_path: Path) -> None:
    stop = Stop()

    async def forever(_ctx: object) -> None:
        await asyncio.Event().wait()

    task = asyncio.ensure_future(handling.run_handler(forever, None, timeout_s=300, stoppable=stop))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    stop.request()
    finished = await task
    assert (finished.outcome, finished.reason) == (None, "stopped")
    assert not task.cancelled()


async def test_handlers_started_together_share_one_timeout_timer() -> None:
    """A claim's jobs start together with one timeout: their deadlines fall on one tick,
    one timer for the batch instead of one per job (issue 18), and each still times out."""
    gate = asyncio.Event()

    async def parked(_ctx: object) -> None:
        await gate.wait()

    loop = asyncio.get_running_loop()
    began = loop.time()
    tasks = [
        asyncio.ensure_future(handling.run_handler(parked, None, timeout_s=0.2, stoppable=Stop()))  # type: ignore[arg-type]
        for _ in range(200)
    ]
    await asyncio.sleep(0)  # every handler armed
    armed = loop.time()
    due = deadlines.deadlines(loop).due

    # the ticks the arming spanned on the loop's clock: one, or two where the batch
    # straddles a tick's end, more only on a machine so busy arming outlasted a tick
    def tick(t: float) -> int:
        return math.ceil((t + 0.2) / deadlines.DEADLINE_TICK_S)

    assert 1 <= len(due) <= tick(armed) - tick(began) + 1 < 200
    finished = await asyncio.gather(*tasks)
    assert {(f.outcome, f.reason) for f in finished} == {(Outcome.FAILED, "timeout")}
    assert due == {}


async def test_ticks_of_handlers_that_returned_do_not_pile_up() -> None:
    """Handlers that return long before their timeout leave no timer per tick behind
    them: with an hour's timeout and a job every 10 ms, pending ticks would otherwise
    be one per 50 ms for an hour (72,000). A timeout already due fires at the first
    await, as asyncio.timeout's."""

    async def quick(_ctx: object) -> None:
        await asyncio.sleep(0)

    loop = asyncio.get_running_loop()
    scheduled_before = len(loop._scheduled)  # type: ignore[attr-defined]
    end = loop.time() + 0.3
    while loop.time() < end:
        done = await handling.run_handler(quick, None, timeout_s=3600, stoppable=Stop())  # type: ignore[arg-type]
        assert done.outcome is Outcome.SUCCEEDED
        await asyncio.sleep(0.01)
    assert len(deadlines.deadlines(loop).due) <= 1
    assert len(loop._scheduled) - scheduled_before <= 1  # type: ignore[attr-defined]

    async def nap(_ctx: object) -> None:
        await asyncio.sleep(0.01)

    late = await handling.run_handler(nap, None, timeout_s=0, stoppable=Stop())  # type: ignore[arg-type]
    assert (late.outcome, late.reason) == (Outcome.FAILED, "timeout")


async def test_a_timeout_leaves_other_cancels_alone() -> None:
    """As asyncio.timeout: a cancel from elsewhere that meets the timeout's propagates,
    and a handler that outlives the timeout's cancel returns what it returned, its task
    no longer cancelling."""

    async def cancelled_elsewhere_too(_ctx: object) -> None:
        try:
            await asyncio.sleep(300)
        except asyncio.CancelledError:
            me = asyncio.current_task()
            assert me is not None
            me.cancel()  # another cancel arrives with the timeout's
            raise

    ended: list[object] = []

    async def run() -> None:
        try:
            ended.append(
                await handling.run_handler(
                    cancelled_elsewhere_too,
                    None,
                    timeout_s=0.05,
                    stoppable=Stop(),  # type: ignore[arg-type]
                )
            )
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    task = asyncio.ensure_future(run())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ended == ["cancelled"]

    async def stubborn(_ctx: object) -> str:
        try:
            await asyncio.sleep(300)
        except asyncio.CancelledError:
            return "kept going"
        return "woke"

    me = asyncio.current_task()
    assert me is not None
    done = await handling.run_handler(stubborn, None, timeout_s=0.05, stoppable=Stop())  # type: ignore[arg-type]
    assert (done.outcome, done.log_tail) == (Outcome.SUCCEEDED, "kept going")
    assert me.cancelling() == 0


async def test_a_stop_that_cannot_be_confirmed_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the process group never disappears (a process stuck where SIGKILL cannot reach
    it), the executor must not report a stop it did not see."""
    real = executor.group_members
    monkeypatch.setattr(executor, "group_members", lambda pgid: real(pgid) or [pgid])
    monkeypatch.setattr(executor, "STOP_GRACE_S", 0.05)
    monkeypatch.setattr(executor, "STOP_DEADLINE_S", 0.2)
    finished = await _stop_once_launched(tmp_path)
    assert (finished.outcome, finished.reason) == (None, "stop-unconfirmed")


async def test_a_job_s_log_is_the_runner_s_alone(tmp_path: Path) -> None:
    """Logs were 0644: a job of another uid read other jobs' output (issue 41)."""
    log = tmp_path / "logs" / "job.log"
    log.parent.mkdir()
    log.write_text("an older run's")
    log.chmod(0o644)
    old = os.umask(0o022)
    try:
        await _run("true", tmp_path)
        assert log.stat().st_mode & 0o777 == 0o600 and log.read_text() == ""
        await _run("no-such-program-anywhere", tmp_path)  # the launch failure's log too
        assert log.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


async def test_an_exit_noticed_after_the_runner_stalled_is_not_dated(tmp_path: Path) -> None:
    """Issue 48: a runner frozen (SIGSTOP) while its job exits notices the exit only when
    it runs again; that moment is an upper bound, not a measurement. Here the loop is
    blocked past the exit, as a freeze would block it."""

    async def frozen(_pid: int, _at: datetime) -> None:
        time.sleep(2 * stalls.STALL_S)  # noqa: ASYNC251 - the fault: the loop does not run

    finished = await executor.run_command(
        "true",
        cwd=tmp_path,
        env=executor.job_environment({"FLEETQ_RUN_ID": "r-stall"}),
        timeout_s=30,
        log_path=tmp_path / "logs" / "job.log",
        on_start=frozen,
        stop=asyncio.Event(),
    )
    assert finished.outcome == Outcome.SUCCEEDED
    assert finished.ended_monotonic is not None and not finished.end_dated


def _slow_clean_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clean-up after a run (in a thread) takes longer than a stall, as on a machine
    loaded by other work: the loop keeps running meanwhile."""
    end_run = executor._end_run

    def slow(run_id: str, session: int) -> None:
        time.sleep(2 * stalls.STALL_S)
        end_run(run_id, session)

    monkeypatch.setattr(executor, "_end_run", slow)


async def test_an_exit_a_stall_hid_stays_undated_however_slow_the_clean_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45: the end was dated after the clean-up, and a clean-up slower than the
    stall's margin made an exit the freeze hid look measured (a 1.2 s "measured" overlap
    where the jobs' records showed a 4.6 s gap). Red before: end_dated was True."""
    _slow_clean_up(monkeypatch)

    async def frozen(_pid: int, _at: datetime) -> None:
        time.sleep(2 * stalls.STALL_S)  # noqa: ASYNC251 - the fault: the loop does not run

    finished = await executor.run_command(
        "true",
        cwd=tmp_path,
        env=executor.job_environment({"FLEETQ_RUN_ID": "r-stall-slow"}),
        timeout_s=30,
        log_path=tmp_path / "logs" / "job.log",
        on_start=frozen,
        stop=asyncio.Event(),
    )
    assert finished.outcome == Outcome.SUCCEEDED and not finished.end_dated


async def test_a_stop_of_a_run_that_exited_in_a_stall_is_not_dated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner thaws to a stop (its lease moved on) for a process that exited while
    it was frozen: the stop caused no end, and when the exit was is unknown. Red before:
    dated by the end of a clean-up that came seconds after the stall."""
    _slow_clean_up(monkeypatch)
    stop = asyncio.Event()

    async def frozen(_pid: int, _at: datetime) -> None:
        stop.set()  # the stop is due as the runner thaws
        time.sleep(2 * stalls.STALL_S)  # noqa: ASYNC251 - the fault: the loop does not run

    finished = await executor.run_command(
        "true",
        cwd=tmp_path,
        env=executor.job_environment({"FLEETQ_RUN_ID": "r-stall-zombie"}),
        timeout_s=30,
        log_path=tmp_path / "logs" / "job.log",
        on_start=frozen,
        stop=stop,
    )
    assert not finished.end_dated, finished


async def test_an_exit_noticed_as_it_happens_is_dated(tmp_path: Path) -> None:
    finished, _ = await _run("sleep 0.3", tmp_path)
    assert finished.outcome == Outcome.SUCCEEDED and finished.end_dated


async def test_a_run_stopped_after_a_stall_has_its_end_dated(tmp_path: Path) -> None:
    """A runner that thaws and then stops its run caused the end itself, after the stall:
    that end is dated (the overlap it closes is measured)."""

    async def frozen(_pid: int, _at: datetime) -> None:
        time.sleep(2 * stalls.STALL_S)  # noqa: ASYNC251 - the fault: the loop does not run

    stop = asyncio.Event()
    run = asyncio.create_task(
        executor.run_command(
            "sleep 30",
            cwd=tmp_path,
            env=executor.job_environment({"FLEETQ_RUN_ID": "r-stall-stop"}),
            timeout_s=60,
            log_path=tmp_path / "logs" / "job.log",
            on_start=frozen,
            stop=stop,
        )
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while (w := stalls._WATCHES.get(loop)) is None or w.stall_ended == -math.inf:
        assert loop.time() < deadline, "the watch never saw the stall"
        await asyncio.sleep(0.01)
    stop.set()  # after the stall: the end that follows is the stop's
    finished = await run
    assert finished.outcome is None and finished.signal is not None and finished.end_dated
