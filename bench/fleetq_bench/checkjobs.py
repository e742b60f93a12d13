"""The check-job benchmark: what a real `fleetq-runner` adds between a claim and the
first instruction of a check's process, and what staging a commit costs.

A real runner process (one slot in lane `checks`) runs check jobs of a real git
repository, one at a time so nothing queues. The check's command is `date +%s.%N`: its
first instruction prints the time, on the clock the database's `clock_timestamp()`
reads too (so the server must run on this machine). Per job, from the database:

- claim -> process start = the command's printed time - `claimed_at`;
- staging = the `prepare_ms` the runner reports with the start (the mirror fetch or
  clone, the per-execution clone and checkout);
- overhead = claim -> process start - staging: the runner's own cost (the claim's reply,
  the task, the journal, the fork and exec);
- process start -> start report arrival, and submit -> claim (the wake-up), for context.

Jobs: one warm-up (not counted); `--cold` jobs each with the runner's mirror removed
first (the runner is idle then), so staging clones the repository; `--jobs` at a commit
the mirror has (warm); `--new-commits` at a commit made just before (warm mirror, which
must fetch). Target (issue #18): overhead p50 <= 15 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from fleetq.core import migrate, producer
from fleetq.core.db import resolve_dsn
from fleetq.core.driver import AsyncpgDriver, Driver
from fleetq.core.models import JobId
from fleetq_bench import figures, harness
from fleetq_bench.sql import SQL

LANE, PROJECT, OPERATION, NODE = "checks", "stamp", "stamp", "checkbench"
TARGET_OVERHEAD_P50_MS = 15.0
GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "fleetq bench",
    "GIT_AUTHOR_EMAIL": "bench@fleetq.invalid",
    "GIT_COMMITTER_NAME": "fleetq bench",
    "GIT_COMMITTER_EMAIL": "bench@fleetq.invalid",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The check-job benchmark's options."""
    a = parser.add_argument
    a("--jobs", type=int, default=50, help="jobs at a commit the mirror has (warm)")
    a("--new-commits", type=int, default=10, help="jobs each at a new commit (warm, fetch)")
    a("--cold", type=int, default=5, help="jobs each with the mirror removed first (cold)")
    a("--files", type=int, default=200, help="files in the benchmark's repository")
    a("--timeout", type=float, default=120.0, help="give up on one job after this long")


def run(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark against the server of `dsn`; returns the JSON report."""
    with (
        migrate.scratch_database(dsn, "fleetq_bench_checks") as db,
        tempfile.TemporaryDirectory(prefix="fleetq-bench-checks-") as tmp,
    ):
        work = Path(tmp)
        repo = work / "repo"
        first = make_repository(repo, files=args.files)
        harness.apply_config(db, fleet_file(repo), work)
        runner = _start_runner(db, work)
        try:
            jobs = asyncio.run(_measure(db, args, repo, first, work, runner))
        finally:
            _stop(runner)
    return jobs


def fleet_file(repo: Path) -> str:
    """The scratch fleet: one lane, one project (the repository), one check."""
    return f"""
[settings]
lease_seconds = 30
[lanes.{LANE}]
[projects.{PROJECT}]
repository = {json.dumps(str(repo))}
[projects.{PROJECT}.operations.{OPERATION}]
lane = "{LANE}"
command = "date +%s.%N"
timeout_seconds = 60
"""


def make_repository(path: Path, *, files: int) -> str:
    """A git repository with `files` small files in one commit; returns that commit."""
    path.mkdir(parents=True)
    _git(path, "init", "-q", "--initial-branch=main")
    for i in range(files):
        sub = path / f"pkg{i % 10}"
        sub.mkdir(exist_ok=True)
        (sub / f"module{i}.py").write_text(f'"""Module {i}."""\n\nVALUE = {i}\n' * 20)
    _git(path, "add", "-A")
    _git(path, "commit", "-qm", "the benchmark's tree")
    return _git(path, "rev-parse", "HEAD")


def new_commit(path: Path, n: int) -> str:
    """One more commit (one file changed); returns it."""
    (path / "CHANGES").write_text(f"change {n}\n")
    _git(path, "add", "CHANGES")
    _git(path, "commit", "-qm", f"change {n}")
    return _git(path, "rev-parse", "HEAD")


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        env={**os.environ, **GIT_ENV},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _start_runner(db: str, work: Path) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "fleetq.runner",
        "--dsn",
        db,
        "--node",
        NODE,
        "--lane",
        f"{LANE}=1",
        "--work-dir",
        str(work / "runner"),
        "--grace",
        "1",
    ]
    with open(work / "runner.log", "wb") as log:
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)


def _stop(runner: subprocess.Popen[bytes]) -> None:
    runner.send_signal(signal.SIGTERM)
    try:
        runner.wait(timeout=30)
    except subprocess.TimeoutExpired:
        runner.kill()
        runner.wait()


async def _measure(
    db: str,
    args: argparse.Namespace,
    repo: Path,
    commit: str,
    work: Path,
    runner: subprocess.Popen[bytes],
) -> dict[str, Any]:
    observer = await AsyncpgDriver.connect(db)

    def alive() -> None:
        if runner.poll() is not None:
            log = (work / "runner.log").read_text(errors="replace")[-2000:]
            raise harness.BenchError(f"the runner exited ({runner.returncode}):\n{log}")

    async def one(sha: str) -> JobId:
        return await _one_job(observer, sha, args.timeout, alive)

    mirrors = work / "runner" / f"{NODE}__runner" / "mirrors"
    try:
        await harness.wait_until(
            lambda: _registered(observer), timeout=60, what="the runner to start", alive=alive
        )
        await one(commit)  # warm-up: the runner's first job pays for first-time code paths
        kinds: dict[str, list[JobId]] = {"cold": [], "warm_same_commit": [], "warm_new_commit": []}
        for _ in range(args.cold):
            shutil.rmtree(mirrors, ignore_errors=True)  # the runner is idle between jobs
            kinds["cold"].append(await one(commit))
        for _ in range(args.jobs):
            kinds["warm_same_commit"].append(await one(commit))
        for n in range(args.new_commits):
            kinds["warm_new_commit"].append(await one(new_commit(repo, n)))
        ids = [j for js in kinds.values() for j in js]
        rows = await observer.fetch(SQL.sql("bench_checks_runs"), ids)
    finally:
        await observer.close()
    by_id = {int(r["id"]): r for r in rows}
    runs = {kind: [job_timings(by_id[j]) for j in js] for kind, js in kinds.items()}
    return checks_report(runs)


async def _registered(observer: Driver) -> bool:
    (row,) = await observer.fetch(SQL.sql("bench_registered"))
    return int(row["n"]) >= 1


async def _one_job(observer: Driver, commit: str, timeout: float, alive: Any) -> JobId:
    """Submit one check and wait until it is done; nothing else is queued meanwhile."""
    result = await producer.submit(
        observer, project=PROJECT, operation=OPERATION, commit=commit, submitted_by="bench"
    )

    async def done() -> bool:
        return not await harness.queue_open(observer)

    await harness.wait_until(done, timeout=timeout, what=f"job {result.job_id}", alive=alive)
    return result.job_id


def job_timings(row: dict[str, Any]) -> dict[str, Any]:
    """One job's figures (ms) from its `bench_checks_runs` row; `printed` is the time
    its command printed at its first instruction (None: no output, the job failed)."""
    printed = _printed(row.get("log_tail"))
    claimed, prepare_ms = row.get("claimed"), row.get("prepare_ms")
    found: dict[str, Any] = {"job_id": int(row["id"]), "state": row["state"]}
    if printed is None or claimed is None or prepare_ms is None:
        return found
    to_process = (printed - float(claimed)) * 1000
    found.update(
        claim_to_process_ms=to_process,
        staging_ms=float(prepare_ms),
        overhead_ms=to_process - float(prepare_ms),
        submit_to_claim_ms=(float(claimed) - float(row["created"])) * 1000,
    )
    if row.get("start_reported") is not None:
        found["process_to_start_report_ms"] = (float(row["start_reported"]) - printed) * 1000
    return found


def _printed(log_tail: str | None) -> float | None:
    for line in (log_tail or "").splitlines():
        try:
            return float(line.strip())
        except ValueError:
            continue
    return None


def checks_report(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Percentiles per kind of job, and the overhead over all of them (staging is left
    out of it, so cold and warm jobs measure the same thing)."""
    every = [r for rs in runs.values() for r in rs]

    def values(rows: list[dict[str, Any]], key: str) -> list[float]:
        return [float(r[key]) for r in rows if key in r]

    overhead = figures.summary(values(every, "overhead_ms"))
    p50 = overhead["p50"]
    return {
        "benchmark": "check-jobs",
        "jobs": len(every),
        "succeeded": sum(1 for r in every if r["state"] == "succeeded"),
        "overhead_ms": overhead,
        "target_overhead_p50_ms": TARGET_OVERHEAD_P50_MS,
        "target_met": None if p50 is None else float(p50) <= TARGET_OVERHEAD_P50_MS,
        "claim_to_process_ms": figures.summary(values(every, "claim_to_process_ms")),
        "process_to_start_report_ms": figures.summary(values(every, "process_to_start_report_ms")),
        "submit_to_claim_ms": figures.summary(values(every, "submit_to_claim_ms")),
        "staging_ms": {
            kind: figures.summary(values(rows, "staging_ms")) for kind, rows in runs.items()
        },
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m fleetq_bench.checkjobs`: run and print the JSON report."""
    parser = argparse.ArgumentParser(prog="python -m fleetq_bench.checkjobs", description=__doc__)
    parser.add_argument("--dsn", help="PostgreSQL server (default: $FLEETQ_DSN, else embedded)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    report = run(resolve_dsn(args.dsn), args)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
