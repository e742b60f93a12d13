"""How long a `fleetq` command takes on the caller's clock, and where the time goes.

    uv run python scripts/cli_start.py [--dsn DSN] [--runs 9]

Prints, per command, the median wall time of `--runs` runs as a shell would see it
(process start to exit), then the import time of `fleetq result` by top-level package
(`python -X importtime`). A CI loop polling `fleetq result` pays the first figure on
every call (issue 42, item 7). Needs a migrated database (`fleetq migrate`); the
commands ask about a project that does not exist, so nothing is written.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

FLEETQ = [sys.executable, "-m", "fleetq"]
NO_SHA = "0" * 40
COMMANDS = {
    "fleetq --version": ["--version"],
    "fleetq --help": ["--help"],
    "fleetq result P C": ["result", "nosuch", NO_SHA],
    "fleetq wait 1 --timeout 0": ["wait", "999999999", "--timeout", "0"],
    "fleetq jobs --limit 1": ["jobs", "--limit", "1"],
}


def _wall(argv: list[str], env: dict[str, str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _imports(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Self time of each import, summed by top-level package, in ms."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv[1:]],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    by_package: dict[str, float] = {}
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, _, name = line.removeprefix("import time:").split("|")
        package = name.strip().split(".")[0]
        by_package[package] = by_package.get(package, 0.0) + int(own) / 1000
    return by_package


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="default: $FLEETQ_DSN, else the embedded server")
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    env = dict(os.environ)
    if args.dsn:
        env["FLEETQ_DSN"] = args.dsn
    env.setdefault("PYTHONPATH", str(Path(__file__).parents[1]))
    peers = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python: import psycopg": [sys.executable, "-c", "import psycopg"],
        "python: import pydantic": [sys.executable, "-c", "from pydantic import BaseModel"],
    }
    if (psql := shutil.which("psql")) and env.get("FLEETQ_DSN"):
        peers["psql -c 'SELECT 1'"] = [psql, env["FLEETQ_DSN"], "-c", "SELECT 1"]
    for label, argv in peers.items():
        print(f"{label:28} {_wall(argv, env, args.runs) * 1000:6.0f} ms  (a peer)")
    for label, words in COMMANDS.items():
        print(f"{label:28} {_wall([*FLEETQ, *words], env, args.runs) * 1000:6.0f} ms")
    by_package = _imports([*FLEETQ, *COMMANDS["fleetq result P C"]], env)
    total = sum(by_package.values())
    print(f"\nimports of `fleetq result`: {total:.0f} ms")
    for package, ms in sorted(by_package.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {package:26} {ms:6.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
