"""SQL mutants: break the protocol on purpose, one small change at a time, and check that
a test goes red each time.

    uv run python scripts/mutants.py [--dsn SERVER] [--only NAME ...] [--jobs N] [--list]
                                     [--baseline]

The mutants are listed, each with why it matters, in scripts/mutants.toml. `--jobs`
worker sessions (default 2; scripts/mutant_worker.py), each a pytest session on a
scratch copy of the code, the migrations and the tests, judge them one after another:
a worker applies the mutant to one protocol file (migrations/protocol/) and to its live
databases, runs the mutant's `first` test, then, if that passed, every protocol test,
stopping at the first failure, and puts the file back. All against one PostgreSQL
server: --dsn, else FLEETQ_TEST_DSN, else an embedded server started for the run. A
mutant is *caught* when a test fails (not merely errors: a mutant that breaks the SQL's
syntax proves nothing). Exit status 1 if any mutant survived or could not be judged, so
CI fails.

First it says how many of the protocol's guards a mutant covers (scripts/guards.py: each
IF that refuses, each WHERE of a write, each clock read and lock) and, on a full run,
fails on a guard that neither a mutant covers nor scripts/guards.toml lists.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ConfigDict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import guards  # noqa: E402  (scripts/guards.py)

from tests.conftest import embedded_server  # noqa: E402

LIST = ROOT / "scripts" / "mutants.toml"
# The protocol tests, quickest first (with -x a caught mutant costs only the tests run
# before the first failure); the state machine, the slowest, last.
TESTS = (
    "tests/integration/test_database_clock.py",
    "tests/integration/test_guards_refusals.py",
    "tests/integration/test_claim_writes.py",
    "tests/integration/test_claim_stages.py",
    "tests/integration/test_bystanders.py",
    "tests/integration/test_runner_rows.py",
    "tests/integration/test_schedule_rows.py",
    "tests/integration/test_runner_id.py",
    "tests/integration/test_reaper.py",
    "tests/integration/test_recount.py",
    "tests/integration/test_lease_edges.py",
    "tests/integration/test_query_plans.py",
    "tests/integration/test_leases.py",
    "tests/integration/test_dependencies.py",
    "tests/integration/test_aging.py",
    "tests/integration/test_caps.py",
    "tests/integration/test_retries.py",
    "tests/integration/test_submit.py",
    "tests/integration/test_recovery_never_waits.py",
    "tests/integration/test_prune.py",
    "tests/integration/test_eligibility.py",
    "tests/integration/test_concurrency.py",
    "tests/integration/test_roles.py",
    "tests/integration/test_protocol_machine.py",
    "tests/integration/test_api.py",
    "tests/integration/test_authz_matrix.py",
    "tests/integration/test_tenants.py",
    "tests/integration/test_output_ring.py",
    "tests/integration/test_verdicts.py",
    "tests/integration/test_wait.py",
    "tests/integration/test_rerun.py",
    "tests/integration/test_schedules.py",
)
COPIED = ("fleetq", "migrations", "tests", "docs", "pyproject.toml")
UNUSED_PLUGINS = ("textual-snapshot", "syrupy", "xdist", "xdist.looponfail", "anyio")


class Mutant(BaseModel):
    """One small break of one protocol file."""

    model_config = ConfigDict(frozen=True)

    name: str
    file: str
    find: str
    replace: str
    why: str
    count: int = 1
    first: str | None = None  # the test file likely to catch it, run before the others

    def tests(self) -> tuple[tuple[str, ...], ...]:
        """The protocol tests in the order they run: its `first` file alone (pytest then
        collects one file, not all of them: most mutants are caught there), then the
        rest. With -x, a caught mutant costs only the tests run before the failure."""
        if self.first is None:
            return (TESTS,)
        return ((self.first,), tuple(t for t in TESTS if t != self.first))

    def applied(self, text: str) -> str:
        """Its file's text with the mutant applied; refuse when `find` no longer matches
        as listed."""
        found = text.count(self.find)
        if found != self.count:
            raise SystemExit(
                f"mutant {self.name}: expected {self.count} match(es) of its `find` in "
                f"protocol/{self.file}, found {found}: the SQL changed, update "
                f"{LIST.relative_to(ROOT)}"
            )
        return text.replace(self.find, self.replace)


class Verdict(BaseModel):
    """What the tests said of one mutant."""

    name: str
    caught: bool
    by: str  # the first test that failed, or why it could not be judged
    seconds: float


def load() -> list[Mutant]:
    """The listed mutants."""
    with LIST.open("rb") as f:
        return [Mutant.model_validate(m) for m in tomllib.load(f)["mutant"]]


@contextmanager
def server(dsn: str | None) -> Iterator[str]:
    """The server the tests run against (started here when none is named)."""
    if dsn:
        yield dsn
        return
    with embedded_server() as started:
        yield started


class Worker:
    """One pytest session on a scratch copy of the code that judges mutant after mutant
    (scripts/mutant_worker.py): the protocol tests are collected once, and each mutant
    costs its migrate and its tests, not a process of its own."""

    def __init__(self, dsn: str, scratch: Path, files: tuple[str, ...]) -> None:
        self.dsn = dsn
        self.copy = scratch
        self.files = files
        for entry in COPIED:
            source = ROOT / entry
            if source.is_dir():
                shutil.copytree(
                    source, scratch / entry, ignore=shutil.ignore_patterns("__pycache__")
                )
            else:
                shutil.copy2(source, scratch / entry)
        shutil.copy2(ROOT / "scripts" / "mutant_worker.py", scratch / "mutant_worker.py")
        self.log = scratch / "worker.log"
        self._start()

    def _start(self) -> None:
        jobs_read, self._jobs_write = os.pipe()
        self._verdicts_read, verdicts_write = os.pipe()
        env = {
            **os.environ,
            "PYTHONPATH": str(self.copy),
            "FLEETQ_TEST_DSN": self.dsn,
            "FLEETQ_MUTANT_IN": str(jobs_read),
            "FLEETQ_MUTANT_OUT": str(verdicts_write),
        }
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "mutant_worker",
                    "-p",
                    "no:randomly",
                    "-p",
                    "no:cacheprovider",
                    # the console's screenshots and the parallel runner are not used here
                    *(a for plugin in UNUSED_PLUGINS for a in ("-p", f"no:{plugin}")),
                    *self.files,
                ],
                cwd=self.copy,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(jobs_read, verdicts_write),
            )
        os.close(jobs_read)
        os.close(verdicts_write)
        self._jobs = os.fdopen(self._jobs_write, "w", buffering=1)
        self._verdicts = os.fdopen(self._verdicts_read, "r")

    def judge(
        self,
        mutant: Mutant | None,
        groups: tuple[tuple[str, ...], ...],
        budget_s: float | None = None,
    ) -> Verdict:
        """Run the groups with `mutant` applied (None: as is); the first group with a
        failing test catches it."""
        start = time.monotonic()
        name = mutant.name if mutant else "(none)"
        file = mutant.file if mutant else "claim.sql"
        text = (ROOT / "migrations" / "protocol" / file).read_text()
        if mutant is not None:
            text = mutant.applied(text)
        job: dict[str, object] = {
            "name": name,
            "file": file,
            "text": text,
            "groups": [list(g) for g in groups],
        }
        if budget_s is not None:
            job["budget_s"] = budget_s
        try:
            self._jobs.write(json.dumps(job) + "\n")
            line = self._verdicts.readline()
        except BrokenPipeError:
            line = ""
        if not line:  # the session ended: say why, and start another for what follows
            self.close()
            tail = self.log.read_text()[-600:] if self.log.exists() else ""
            self._start()
            seconds = time.monotonic() - start
            return Verdict(
                name=name, caught=False, by=f"not judged: worker ended: {tail}", seconds=seconds
            )
        verdict = Verdict.model_validate_json(line)
        if verdict.by.startswith("not judged"):  # the session ended after it: a new one
            self.close()
            self._start()
        return verdict

    def close(self) -> None:
        """End the session (its fixtures drop their databases)."""
        for stream in (self._jobs, self._verdicts):
            with contextlib.suppress(OSError):
                stream.close()
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextmanager
def workers(dsn: str, count: int, files: tuple[str, ...]) -> Iterator[queue.Queue[Worker]]:
    """`count` worker sessions collecting `files`, each on a scratch copy of its own,
    handed out by a queue."""
    with tempfile.TemporaryDirectory(prefix="fleetq-mutants-") as scratch:
        idle: queue.Queue[Worker] = queue.Queue()
        made = []
        try:
            for index in range(count):
                directory = Path(scratch) / str(index)
                directory.mkdir()
                made.append(Worker(dsn, directory, files))
                idle.put(made[-1])
            yield idle
        finally:
            for worker in made:
                worker.close()


def collected(mutants: list[Mutant]) -> tuple[str, ...]:
    """The test files a worker collects: the protocol tests and every mutant's `first`."""
    firsts = [m.first.split("::")[0] for m in mutants if m.first]
    return tuple(dict.fromkeys((*TESTS, *firsts)))


def _with(idle: queue.Queue[Worker], use: Callable[[Worker], Verdict]) -> Verdict:
    """Run `use` on an idle worker, then give the worker back."""
    worker = idle.get()
    try:
        return use(worker)
    finally:
        idle.put(worker)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="server (default: $FLEETQ_TEST_DSN, else embedded)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutants only")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument(
        "--baseline", action="store_true", help="first check the tests pass unmutated"
    )
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once (default 2)")
    args = parser.parse_args()
    mutants = load()
    if args.list:
        for m in mutants:
            print(f"{m.name:40} protocol/{m.file}\n    {' '.join(m.why.split())}")
        return 0
    if args.only:
        unknown = set(args.only) - {m.name for m in mutants}
        if unknown:
            parser.error(f"no such mutant: {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.name in args.only]
    coverage = guards.check()
    print(guards.summary(coverage), flush=True)
    if not args.only and not coverage.ok:
        print("a guard has no mutant: add one, or list it in scripts/guards.toml (why)")
        return 1
    for m in mutants:  # every mutant still applies
        m.applied((ROOT / "migrations" / "protocol" / m.file).read_text())
    jobs = max(1, min(args.jobs, len(mutants)))
    started = time.monotonic()
    with (
        server(args.dsn or os.environ.get("FLEETQ_TEST_DSN")) as dsn,
        workers(dsn, jobs, collected(mutants)) as idle,
    ):
        if args.baseline:
            base = _with(idle, lambda w: w.judge(None, (TESTS,)))
            print(f"unmutated: {base.by if not base.caught else 'FAILED ' + base.by}")
            if base.caught or base.by != "every test passed":
                print("the tests fail without any mutant: fix that first")
                return 1

        def judged(m: Mutant) -> Verdict:
            verdict = _with(idle, lambda w: w.judge(m, m.tests()))
            mark = "caught  " if verdict.caught else "SURVIVED"
            print(f"{mark} {m.name:40} {verdict.seconds:5.1f}s  {verdict.by}", flush=True)
            return verdict

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            verdicts = list(pool.map(judged, mutants))
    survived = [v for v in verdicts if not v.caught]
    print(
        f"\n{len(verdicts) - len(survived)} of {len(verdicts)} mutants caught "
        f"({time.monotonic() - started:.0f} s)"
    )
    for v in survived:
        print(f"  survived: {v.name}: {v.by}")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
