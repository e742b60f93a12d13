"""SQL mutants: break the protocol on purpose, one small change at a time, and check that
a test goes red each time.

    uv run python scripts/mutants.py [--dsn SERVER] [--only NAME ...] [--jobs N] [--list]
                                     [--baseline]

The mutants are listed, each with why it matters, in scripts/mutants.toml. For each one
the script copies the code, the migrations and the tests into a scratch directory,
applies the mutant to one protocol file (migrations/protocol/), and runs the protocol
tests there (`-x`: the first failure is enough) against one PostgreSQL server: --dsn,
else FLEETQ_TEST_DSN, else an embedded server started for the run. A mutant is *caught*
when a test fails (not merely errors: a mutant that breaks the SQL's syntax proves
nothing). Mutants run `--jobs` at a time (default 2). Exit status 1 if any mutant
survived or could not be judged, so CI fails.

First it says how many of the protocol's guards a mutant covers (scripts/guards.py: each
IF that refuses, each WHERE of a write, each clock read and lock) and, on a full run,
fails on a guard that neither a mutant covers nor scripts/guards.toml lists.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
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
_FAILED = re.compile(r"^FAILED (\S+)", re.M)


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

    def apply(self, protocol: Path) -> None:
        """Patch the file under `protocol`; refuse when `find` no longer matches as listed."""
        path = protocol / self.file
        text = path.read_text()
        found = text.count(self.find)
        if found != self.count:
            raise SystemExit(
                f"mutant {self.name}: expected {self.count} match(es) of its `find` in "
                f"protocol/{self.file}, found {found}: the SQL changed, update "
                f"{LIST.relative_to(ROOT)}"
            )
        path.write_text(text.replace(self.find, self.replace))


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


def run(mutant: Mutant | None, dsn: str, groups: tuple[tuple[str, ...], ...]) -> Verdict:
    """Run the protocol tests, group after group, on a copy of the code with `mutant`
    applied (None: as is); the first group with a failing test catches it."""
    start = time.monotonic()
    name = mutant.name if mutant else "(none)"
    with tempfile.TemporaryDirectory(prefix="fleetq-mutant-") as scratch:
        copy = Path(scratch)
        for entry in COPIED:
            source = ROOT / entry
            if source.is_dir():
                shutil.copytree(source, copy / entry, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, copy / entry)
        if mutant is not None:
            mutant.apply(copy / "migrations" / "protocol")
        env = {**os.environ, "PYTHONPATH": str(copy), "FLEETQ_TEST_DSN": dsn}
        for tests in groups:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-x",
                    "-q",
                    "-p",
                    "no:randomly",
                    "-p",
                    "no:cacheprovider",
                    # the console's screenshots and the parallel runner are not used here:
                    # loading them costs 2 s of CPU per run, 41 mutants over
                    *(a for plugin in UNUSED_PLUGINS for a in ("-p", f"no:{plugin}")),
                    *tests,
                ],
                cwd=copy,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            failed = _FAILED.findall(done.stdout)
            if done.returncode == 1 and failed:
                seconds = time.monotonic() - start
                return Verdict(name=name, caught=True, by=failed[0], seconds=seconds)
            if done.returncode != 0:
                tail = " ".join(done.stdout.strip().splitlines()[-1:]) or done.stderr.strip()[-200:]
                seconds = time.monotonic() - start
                return Verdict(name=name, caught=False, by=f"not judged: {tail}", seconds=seconds)
    seconds = time.monotonic() - start
    return Verdict(name=name, caught=False, by="every test passed", seconds=seconds)


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
    with tempfile.TemporaryDirectory() as check:  # every mutant still applies
        shutil.copytree(ROOT / "migrations" / "protocol", Path(check) / "p")
        for m in mutants:
            m.apply(Path(check) / "p")
            shutil.copy2(ROOT / "migrations" / "protocol" / m.file, Path(check) / "p" / m.file)
    with server(args.dsn or os.environ.get("FLEETQ_TEST_DSN")) as dsn:
        if args.baseline:
            base = run(None, dsn, (TESTS,))
            print(f"unmutated: {base.by if not base.caught else 'FAILED ' + base.by}")
            if base.caught or base.by != "every test passed":
                print("the tests fail without any mutant: fix that first")
                return 1

        def judged(m: Mutant) -> Verdict:
            verdict = run(m, dsn, m.tests())
            mark = "caught  " if verdict.caught else "SURVIVED"
            print(f"{mark} {m.name:40} {verdict.seconds:5.1f}s  {verdict.by}", flush=True)
            return verdict

        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
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
