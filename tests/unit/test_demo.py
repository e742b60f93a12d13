"""The demo's parts that need no database: its timetable, its choices of victim and of
job to cancel, its job stream, its configuration, its repositories and its verdict."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fleetq.core import config, stats
from fleetq.core.errors import FleetqError
from fleetq.core.models import JobId
from fleetq.core.report import LiveJob, Recovery, RunFigures, StateCount, Stop
from fleetq.demo import faults, repo, scenario
from fleetq.demo import report as printed
from fleetq.demo.fleet import RUNNERS, Fleet, runner_toml
from fleetq.demo.plan import Fault, Plan, RunLog
from fleetq.runner import config as runner_config

T0 = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
A, B, C = (spec.runner_id for spec in RUNNERS)


@pytest.mark.parametrize("duration", [20.0, 60.0, 300.0])
def test_the_fault_heals_before_two_thirds_and_the_cancel_follows(duration: float) -> None:
    plan = Plan(duration_s=duration, lease_s=3)
    assert 0 < plan.fault_at < plan.cancel_at < plan.duration_s
    assert plan.heal_by >= plan.fault_at + plan.lease_s + 6  # room for expiry and a claim
    if duration >= 60:
        assert plan.heal_by == pytest.approx(2 * duration / 3)
    assert plan.interval_s >= 5 and plan.duration_s / plan.interval_s <= 13


def _live(
    job: int, owner: str, *, op: str = "integration", running_s: float | None = 0.5
) -> LiveJob:
    return LiveJob(
        job_id=JobId(job),
        project="webapp",
        operation=op,
        state="running" if running_s is not None else "claimed",
        lease_owner=owner,
        lease_version=1,
        launched_at=T0 if running_s is not None else None,
        running_s=running_s,
    )


def test_the_victim_runs_a_fresh_slow_check_preferably_a_release_verification_one() -> None:
    runners = [A, B, C]
    live = [_live(1, A), _live(2, C), _live(3, B, running_s=5.0)]
    assert faults.pick_victim(live, runners, prefer=[2]) == C
    assert faults.pick_victim(live, runners, prefer=[9]) == A
    assert faults.pick_victim(live, runners, prefer=[9], strict=True) is None
    stale = [_live(3, B, running_s=5.0), _live(4, A, op="unit")]
    assert faults.pick_victim(stale, runners) is None
    assert faults.pick_victim(stale, runners, fallback=True) == B
    assert faults.pick_victim([_live(5, "elsewhere/r")], runners, fallback=True) is None


def test_the_cancel_avoids_the_fault_and_takes_the_newest_slow_check() -> None:
    fault = Fault(runner=A, held=[2], frozen_at=T0)
    live = [
        _live(1, A),  # on the frozen runner
        _live(2, C),  # the fault's job, now elsewhere
        _live(3, B, op="unit", running_s=0.1),
        _live(4, B, running_s=3.0),
        _live(5, C, running_s=1.0),
        _live(6, C, running_s=None),  # claimed, not running
    ]
    chosen = faults.pick_cancel(live, [A, B, C], fault)
    assert chosen is not None and chosen.job_id == 5
    assert faults.pick_cancel(live[:2], [A, B, C], fault) is None
    first = faults.pick_cancel(live, [A, B, C], None)
    assert first is not None and first.job_id == 1


def _repos(tmp_path: Path) -> dict[str, repo.DemoRepo]:
    return {
        name: repo.DemoRepo(name=name, path=tmp_path / name, commits=(f"{i}" * 40, "f" * 40))
        for i, name in enumerate(scenario.PROJECTS, start=1)
    }


def test_the_stream_repeats_every_ninth_submit_and_is_replayable(tmp_path: Path) -> None:
    repos = _repos(tmp_path)
    first = scenario.Stream("abc123", repos)
    requests = [first.next() for _ in range(36)]
    keys = [r.key for r in requests]
    repeats = [i for i in range(1, len(keys)) if keys[i] in keys[:i]]
    assert repeats == [8, 17, 26, 35]
    again = scenario.Stream("abc123", repos)
    assert [again.next() for _ in range(36)] == requests
    for r in requests:
        assert r.project in scenario.MIX[r.operation][1]
        assert r.identity in scenario.IDENTITIES
        assert r.commit in repos[r.project].commits
        assert (r.payload is not None) == (r.operation == "publish")


def test_the_configuration_loads_and_says_what_the_demo_needs(tmp_path: Path) -> None:
    path = scenario.write_config(tmp_path / "fleet.toml", _repos(tmp_path), lease_s=3)
    fleet = config.load(path)
    assert fleet.settings.lease_seconds == 3
    assert set(fleet.lanes) == {"checks", "control"}
    assert {n: i.role for n, i in fleet.identities.items()}["release-bot"] == (
        "release-verification"
    )
    assert {n: p.release_gate for n, p in fleet.projects.items()} == scenario.PROJECTS
    webapp = fleet.projects["webapp"].operations
    assert webapp["browser"].capabilities == ["browser"]
    assert webapp["staging"].timeout_seconds == 2
    assert webapp["unit"].command is not None and sys.executable in webapp["unit"].command
    assert "browser" not in fleet.projects["tools"].operations


def test_runner_settings_are_accepted_by_the_runner(tmp_path: Path) -> None:
    path = tmp_path / "runner.toml"
    path.write_text(runner_toml())
    loaded = runner_config.load({"node": "n", "lanes": {"checks": 1}}, path)
    assert (loaded.reap_interval_s, loaded.grace_s) == (1.0, 5.0)
    a, b, c = RUNNERS
    assert "browser" not in a.capabilities and "browser" in b.capabilities
    assert b.lanes["checks"] < c.lanes["checks"] and b.memory_mb < c.memory_mb
    argv = c.argv(path, tmp_path)
    assert argv[:3] == [sys.executable, "-m", "fleetq.runner"]
    assert "--capability" in argv and "checks=3" in argv


def _check(repository: Path, commit: str, module: str, tmp_path: Path) -> int:
    """Run one of the repository's checks in a checkout of `commit`, as a runner would."""
    tree = tmp_path / commit[:8]
    if not tree.exists():
        subprocess.run(["git", "clone", "-q", str(repository), str(tree)], check=True)
        subprocess.run(["git", "-C", str(tree), "checkout", "-q", commit], check=True)
    return subprocess.run(
        [sys.executable, "-B", "-m", f"checks.{module}"], cwd=tree, capture_output=True
    ).returncode


def test_repositories_are_reproducible_and_their_checks_are_real(tmp_path: Path) -> None:
    built = repo.build(tmp_path / "one", "webapp")
    assert len(built.commits) == len(repo.HISTORY) == 5
    assert repo.build(tmp_path / "two", "webapp").commits == built.commits
    assert repo.build(tmp_path / "one", "webapp").commits == built.commits  # rebuilt in place
    assert repo.build(tmp_path / "three", "tools").commits != built.commits
    c1, _, c3, c4, _ = built.commits
    assert _check(built.path, c1, "unit", tmp_path) == 0
    assert _check(built.path, c3, "unit", tmp_path) != 0  # the VAT bug
    assert _check(built.path, c4, "unit", tmp_path) == 0  # fixed
    assert _check(built.path, c4, "lint", tmp_path) == 1  # the TODO is still there


def _figures(**changes: object) -> RunFigures:
    overlap = stats.Overlap(
        job_id=JobId(7),
        older_token=1,
        newer_token=2,
        older_runner=A,
        newer_runner=C,
        started_at=T0,
        ended_at=T0 + timedelta(seconds=1.5),
        open=False,
        end_confirmed=True,
        end_measured=True,
        older_stop_reason="superseded",
    )
    base = RunFigures(
        read_at=T0 + timedelta(minutes=1),
        accepted=3,
        states=[
            StateCount(state="succeeded", reason="", jobs=2),
            StateCount(state="failed", reason="timeout", jobs=1),
        ],
        live=[],
        queue_wait=[],
        phases=[],
        placement=[],
        completed=[],
        interval_s=5,
        recoveries=[
            Recovery(
                job_id=JobId(7),
                kind="lease_expired",
                lost_by=A,
                lease_version=1,
                at=T0,
                claimed_again_at=T0 + timedelta(seconds=0.2),
                claimed_by=C,
                delay_s=0.2,
            )
        ],
        stops=[
            Stop(
                job_id=JobId(7),
                lease_version=1,
                runner_id=A,
                stop_reason="superseded",
                stop_confirmed=True,
                signal=15,
                ended_at=T0,
            )
        ],
        overlaps=[overlap],
        stale_rejections={"heartbeat": 1},
        ledger_writes=2,
        ledger_refused=0,
        ledger_violations=0,
    )
    return base.model_copy(update=changes)


def _log() -> RunLog:
    log = RunLog(tag="abc123", started_at=T0, jobs={5, 6, 7}, submits=4, repeats=1)
    log.fault = Fault(runner=A, held=[7], frozen_at=T0, healed_at=T0 + timedelta(seconds=5))
    return log


def test_a_clean_run_proves_what_the_issue_asks() -> None:
    verdict = printed.judge(_figures(), _log(), [])
    assert verdict.ok and not verdict.warnings
    text = printed.render(_figures(), _log(), Plan(60, 3), verdict, wall_s=70, settle_s=9)
    assert "every accepted job is accounted for: 3 of 3 found, 0 live" in text
    assert "1 reassignment(s), 1 superseded stop(s) confirmed" in text
    assert "overlap window measured (1.500s, end confirmed)" in text
    assert "2 succeeded · 1 failed (1 timeout)" in text
    assert "verdict: OK" in text


@pytest.mark.parametrize(
    ("changes", "problems", "failure"),
    [
        ({"accepted": 4}, [], "1 accepted job(s) LOST"),
        (
            {"states": [StateCount(state="running", reason="", jobs=3)]},
            [],
            "3 job(s) still live",
        ),
        ({"ledger_violations": 1}, [], "1 fenced-ledger violation(s)"),
        ({}, ["runner node-a/runner needed SIGKILL"], "needed SIGKILL"),
    ],
)
def test_what_fails_the_run(changes: dict[str, object], problems: list[str], failure: str) -> None:
    verdict = printed.judge(_figures(**changes), _log(), problems)
    assert not verdict.ok
    assert any(failure in f for f in verdict.failures), verdict.failures
    text = printed.render(_figures(**changes), _log(), Plan(60, 3), verdict, wall_s=1, settle_s=1)
    assert "verdict: FAILED" in text


def test_a_fault_without_an_overlap_is_a_warning_not_a_failure() -> None:
    figures = _figures(overlaps=[], stops=[], recoveries=[])
    verdict = printed.judge(figures, _log(), [])
    assert verdict.ok
    assert len(verdict.warnings) == 2
    no_fault = RunLog(tag="x")
    assert printed.judge(figures, no_fault, []).warnings == [
        "no fault was injected (the run was stopped before it)"
    ]


def test_a_runner_that_died_is_named_in_one_line_with_its_log(tmp_path: Path) -> None:
    """Red before: the error held the log's last 1,500 bytes, cut mid-word, printed with
    its newlines escaped (`exited (-9):\\nen=1 pid=...`)."""
    fleet = Fleet("postgresql:///x", tmp_path)
    log = fleet.log_path("node-b/runner")
    log.parent.mkdir(parents=True)
    log.write_text("x" * 2000 + "\n2026-12-06 20:46:56 INFO claimed job=7\n\n")
    proc = subprocess.Popen(["sh", "-c", "exit 3"])
    proc.wait()
    fleet.procs["node-b/runner"] = proc
    with pytest.raises(FleetqError) as refused:
        fleet.check_alive()
    message = str(refused.value)
    assert "\n" not in message and "exit status 3" in message and str(log) in message
    assert message.endswith("its last line: 2026-12-06 20:46:56 INFO claimed job=7")


def test_a_runner_killed_from_outside_is_started_again(tmp_path: Path) -> None:
    """Found driving: `kill -9` of one runner (to watch its jobs recover) ended the whole
    demo with "runner node-c/runner exited (killed by signal 9)". Red before: it raised."""
    fleet = Fleet("postgresql:///x", tmp_path)
    fleet.log_path("node-b/runner").parent.mkdir(parents=True)
    (tmp_path / "runner.toml").write_text(runner_toml())
    proc = subprocess.Popen(["sleep", "60"])
    proc.kill()
    proc.wait()
    fleet.procs["node-b/runner"] = proc
    said: list[str] = []
    fleet.check_alive(said.append)
    again = fleet.procs["node-b/runner"]
    try:
        assert again is not proc
        assert fleet.restarted == ["runner node-b/runner was killed by signal 9: started again"]
        assert said and said[0].startswith(fleet.restarted[0])
    finally:
        again.kill()
        again.wait()
