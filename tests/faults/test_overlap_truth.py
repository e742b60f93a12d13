"""Overlap windows against the jobs' own records after a runner is killed (issue 48).

A runner is SIGKILLed twice while it runs command jobs, and started again under its id:
once at once, once only after another runner runs one of its jobs again; meanwhile its
connections lose replies, a second runner is frozen and a third cut off, each until
another runner runs one of its jobs (the review's mix, on 532d372). The jobs write when
they start, every 0.1 s while they live and when they end: that is the truth each window
`fleetq overlaps` reports is held to. A window labelled measured must be one that
happened, within 0.5 s of the records; a bounded one must not be shorter than what
happened; and every overlap the records show must be reported.

Embedded server only (it owns the server, like the fault suite).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetq.core import queries
from fleetq.core.db import connect
from fleetq.core.embedded import EmbeddedServer
from tests.conftest import FAST, make_home
from tests.e2e.conftest import wait_until
from tests.faults.scenarios import TERMINAL, FaultFleet, fault_fleet, marks

pytestmark = [
    pytest.mark.slow,
    pytest.mark.scenarios,
    pytest.mark.skipif(
        bool(os.environ.get("FLEETQ_TEST_DSN")),
        reason="the scenario owns an embedded server; it ran in the embedded pass",
    ),
]

# three times the lease: a run outlives its runner's freeze (expiry, reap, a new claim
# and its launch), so the frozen runner stops it when it thaws: the overlap happens
WORK_S = 12.0
JOBS = 16
# jobs keep coming while the faults go on, with room to spare: a job taken from a frozen
# runner must find a free slot at once, not wait for one behind the queue
PACE_S = 2.0
TOLERANCE_S = 0.5  # a measured window against the records


@dataclass(frozen=True)
class Window:
    """One reported overlap window, and what the jobs' records say of the same pair."""

    job: int
    older: int
    newer: int
    reported_s: float
    measured: bool
    real_s: float | None  # None: a run of the pair left no record (it never started)

    def show(self) -> str:
        real = "no record" if self.real_s is None else f"{self.real_s:.3f}s"
        label = "measured" if self.measured else "bounded"
        return f"job {self.job} {self.older}/{self.newer}: {self.reported_s:.3f}s {label}, {real}"


@pytest.fixture
def server() -> Iterator[EmbeddedServer]:
    home = make_home()
    own = EmbeddedServer(home, settings={**FAST, "synchronous_commit": "on"})
    own.ensure_running()
    yield own
    own.stop()
    shutil.rmtree(home, ignore_errors=True)


def _launched_by(fleet: FaultFleet, node: str) -> list[int]:
    """Command jobs whose run `node` launched and that still run there."""
    with connect(fleet.dsn, autocommit=True) as conn:
        rows = conn.execute(
            b"SELECT x.job_id FROM fleetq.executions x JOIN fleetq.jobs j ON j.id = x.job_id "
            b"WHERE x.runner_id = $1 AND x.launched_at IS NOT NULL AND x.ended_at IS NULL "
            b"AND j.lease_owner = $1 AND j.lease_version = x.lease_version",
            [f"{node}/r"],
        ).fetchall()
    return [int(r[0]) for r in rows]


def _claimed_elsewhere_and_launched(fleet: FaultFleet, jobs: list[int], node: str) -> bool:
    with connect(fleet.dsn, autocommit=True) as conn:
        row = conn.execute(
            b"SELECT count(*) FROM fleetq.executions WHERE job_id = ANY($1) "
            b"AND runner_id <> $2 AND launched_at IS NOT NULL",
            [jobs, f"{node}/r"],
        ).fetchone()
    return bool(row and row[0] > 0)


def _settled(fleet: FaultFleet) -> bool:
    return fleet.finished() == len(fleet.jobs)


def _windows(fleet: FaultFleet) -> list[Window]:
    runs = marks(fleet.marks)
    with connect(fleet.dsn, autocommit=True) as conn:
        rows = conn.execute(queries.sql("stats_overlaps").encode(), [False, None, None]).fetchall()
    found = []
    for job, older, newer, _, _, started, ended, _open, _confirmed, measured, *_ in rows:
        assert ended is not None, f"job {job}: a window still open after every job ended"
        a, b = runs.get(int(job), {}).get(int(older)), runs.get(int(job), {}).get(int(newer))
        real = None
        if a and b and "start" in a and "start" in b:
            real = min(_end(a), _end(b)) - max(a["start"], b["start"])
        found.append(
            Window(
                job=int(job),
                older=int(older),
                newer=int(newer),
                reported_s=(ended - started).total_seconds(),
                measured=bool(measured),
                real_s=real,
            )
        )
    return found


def _end(run: dict[str, float]) -> float:
    """When a run ended by its records: its `end`, else its last `alive` (a SIGKILL)."""
    return run.get("end", run.get("alive", run["start"]))


def _history(fleet: FaultFleet) -> str:
    """Each run of a job run more than once, as recorded and as reported (for a reader)."""
    runs = marks(fleet.marks)
    with connect(fleet.dsn, autocommit=True) as conn:
        rows = conn.execute(
            b"SELECT job_id, lease_version, runner_id, extract(epoch FROM launched_at), "
            b"extract(epoch FROM ended_at), end_measured, stop_reason FROM fleetq.executions "
            b"WHERE job_id IN (SELECT job_id FROM fleetq.executions GROUP BY 1 "
            b"HAVING count(*) > 1) ORDER BY 1, 2"
        ).fetchall()
    lines = []
    for job, token, runner, launched, ended, measured, reason in rows:
        run = runs.get(int(job), {}).get(int(token), {})
        truth = (
            f"{run['start']:.3f}-{_end(run):.3f}{'' if 'end' in run else ' (killed)'}"
            if "start" in run
            else "no record"
        )
        stated = f"{float(launched or 0):.3f}-{float(ended or 0):.3f}"
        label = "measured" if measured else "bounded"
        lines.append(f"job {job} token {token} {runner}: {stated} {label} {reason}; ran {truth}")
    return "\n".join(lines)


def _real_overlaps(fleet: FaultFleet) -> dict[tuple[int, int, int], float]:
    """Every pair of runs of one job that overlapped by the records (over 0.05 s)."""
    found = {}
    for job, tokens in marks(fleet.marks).items():
        ordered = sorted((t, r) for t, r in tokens.items() if "start" in r)
        for i, (older, a) in enumerate(ordered):
            for newer, b in ordered[i + 1 :]:
                real = min(_end(a), _end(b)) - max(a["start"], b["start"])
                if real > 0.05:
                    found[(job, older, newer)] = real
    return found


def _runs_elsewhere(fleet: FaultFleet, i: int, held: list[int]) -> bool:
    return _claimed_elsewhere_and_launched(fleet, held, fleet.runners[i].node)


def _cut_off(fleet: FaultFleet, i: int, cut: Callable[[], None], mend: Callable[[], None]) -> None:
    """Cut runner `i` off while it runs a job, until another runner runs one of its jobs
    (or 20 s pass: its jobs may all have ended first), then mend it."""
    node = fleet.runners[i].node
    wait_until(lambda: bool(_launched_by(fleet, node)), what=f"{node} to run a job")
    held = _launched_by(fleet, node)
    cut()
    try:
        wait_until(
            lambda: _runs_elsewhere(fleet, i, held), what="a job run elsewhere", deadline_s=20
        )
    except AssertionError:
        pass  # its jobs ended first: the fault happened, with nothing to take over
    finally:
        mend()


def _faults(fleet: FaultFleet) -> None:
    """The review's mix (issue 48): lost replies on runner 0's connections throughout; it
    is SIGKILLed and started again at once; runner 1 is frozen; runner 0 is killed again
    and started only once another runner runs one of its jobs; runner 2 is cut off."""
    node = fleet.runners[0].node
    fleet.runners[0].proxy.degrade(lose_replies=0.05)
    wait_until(
        lambda: bool(_launched_by(fleet, node)),
        what=f"{node} to run a job",
        deadline_s=90,
        show=lambda: fleet.runners[0].output()[-4000:],
    )
    fleet.kill9(0)
    fleet.start(0)
    wait_until(lambda: fleet.serving(0), what="the killed runner to serve again")
    _cut_off(fleet, 1, lambda: fleet.send(1, signal.SIGSTOP), lambda: fleet.send(1, signal.SIGCONT))
    wait_until(lambda: bool(_launched_by(fleet, node)), what=f"{node} to run a job again")
    held = _launched_by(fleet, node)
    fleet.kill9(0)
    wait_until(lambda: _runs_elsewhere(fleet, 0, held), what="its job run elsewhere", deadline_s=60)
    fleet.start(0)
    wait_until(lambda: fleet.serving(0), what="the killed runner to serve again")
    proxy = fleet.runners[2].proxy
    _cut_off(fleet, 2, proxy.blackhole, proxy.heal)
    fleet.runners[0].proxy.degrade()


def test_overlap_windows_after_a_runner_is_killed_twice_match_the_jobs_records(
    server: EmbeddedServer, tmp_path: Path
) -> None:
    with fault_fleet(server, tmp_path, work_s=WORK_S, mark_jobs=JOBS, effect_jobs=0) as fleet:
        errors: list[BaseException] = []

        def inject() -> None:
            try:
                _faults(fleet)
            except BaseException as exc:  # reported below, in the test's own thread
                errors.append(exc)

        injector = threading.Thread(target=inject, daemon=True)
        injector.start()
        fleet.submit_all(pace_s=PACE_S)
        injector.join(timeout=180)
        assert not injector.is_alive() and not errors, errors
        wait_until(lambda: _settled(fleet), what="every job to end", deadline_s=180)
        with connect(fleet.dsn, autocommit=True) as conn:
            states = conn.execute(
                b"SELECT state, count(*) FROM fleetq.jobs GROUP BY state"
            ).fetchall()
        assert {s for s, _ in states} <= set(TERMINAL), states
        windows = _windows(fleet)
        real = _real_overlaps(fleet)
        print(_history(fleet))
    figures = {
        "scenario": "killed twice: windows against the records",
        "measured_windows": sum(w.measured for w in windows),
        "bounded_windows": sum(not w.measured for w in windows),
        "bounded_that_never_happened": sum(
            not w.measured and (w.real_s is None or w.real_s <= 0) for w in windows
        ),
        "max_overlap_s": round(max(real.values(), default=0.0), 3),
        "measured_overlap_s": round(
            max([w.reported_s for w in windows if w.measured], default=0), 3
        ),
        "bounded_overlap_s": round(
            max([w.reported_s for w in windows if not w.measured], default=0), 3
        ),
        "worst_measured_error_s": round(
            max([abs(w.reported_s - (w.real_s or 0)) for w in windows if w.measured], default=0), 3
        ),
    }
    shown = "\n".join(w.show() for w in windows) or "(no window reported)"
    print(f"windows reported:\n{shown}\noverlaps in the records: {real}")
    for w in windows:
        if w.measured:
            # Its end is measured; its start is the newer run's launch as the database
            # dates it, its claim when the process start (which the node knows only to
            # the second) is earlier, so a window can open before the newer process
            # wrote its first record: measured means within the tolerance of the records
            # (seen: 0.029 s reported where the records show a 0.180 s gap).
            assert w.real_s is not None and w.real_s > -TOLERANCE_S, (
                f"measured, never happened: {w.show()}"
            )
            assert abs(w.reported_s - max(w.real_s, 0.0)) <= TOLERANCE_S, (
                f"measured, wrong: {w.show()}"
            )
        elif w.real_s is not None:
            assert w.reported_s >= w.real_s - 0.05, f"a bound shorter than the truth: {w.show()}"
    reported = {(w.job, w.older, w.newer) for w in windows}
    missing = {pair: s for pair, s in real.items() if pair not in reported}
    assert not missing, f"overlaps the records show and fleetq did not report: {missing}"
    # written only when it passed: fault_table.py counts a run with no figures as failed
    out = Path(os.environ.get("FLEETQ_FAULTS_OUT") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    (out / "killed_twice_records.json").write_text(json.dumps(figures, indent=2) + "\n")
