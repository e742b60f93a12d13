"""Regenerate screenshots/*.svg: every console view on the deterministic scenario.

    uv run python scripts/screenshots.py [--dsn DSN]

Uses the embedded PostgreSQL (or --dsn / FLEETQ_DSN): creates a scratch database,
migrates it, writes the scenario the snapshot tests use (fixed ids, pinned clock), drives
the console through each case and saves one SVG per case, then drops the database.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleetq.core import migrate  # noqa: E402
from fleetq.core.db import connect, resolve_dsn  # noqa: E402
from tests.console import scenario  # noqa: E402
from tests.console.conftest import SIZE  # noqa: E402
from tests.console.test_snapshots import CASES, app_for  # noqa: E402

OUT = ROOT / "screenshots"


async def shoot(dsn: str, case: str) -> Path:
    """Drive one case and save its screen."""
    app = app_for(dsn, case)
    _options, steps = CASES[case]
    async with app.run_test(size=SIZE) as pilot:
        await steps(pilot)
        await pilot.pause()
        path = OUT / f"console-{case.replace('_', '-')}.svg"
        app.save_screenshot(filename=path.name, path=str(OUT))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="server to use (default: $FLEETQ_DSN, else embedded)")
    args = parser.parse_args()
    with migrate.scratch_database(resolve_dsn(args.dsn), "fleetq_screenshots") as dsn:
        with connect(dsn, autocommit=True) as conn:
            scenario.build(conn)
        OUT.mkdir(exist_ok=True)
        for case in CASES:
            print(f"{case:20} -> {asyncio.run(shoot(dsn, case)).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
