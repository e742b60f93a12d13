"""Render the fault suite's JSON figures (one file per scenario) as a Markdown table.

FLEETQ_FAULTS_OUT=faults-out uv run pytest -m scenarios -s
uv run python scripts/fault_table.py faults-out
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = [
    ("scenario", "scenario"),
    ("jobs", "jobs"),
    ("succeeded", "succeeded"),
    ("wall_s", "wall s"),
    ("reassigned", "reassigned"),
    ("lost", "lost"),
    ("zombie_writes", "zombie writes"),
    ("self_races", "self-races"),
    ("max_overlap_s", "max overlap s"),
    ("proxy_resets", "resets"),
    ("submit_retries", "submit retries"),
    ("runner_starts", "runner starts"),
]


def main(argv: list[str]) -> int:
    folder = Path(argv[1] if len(argv) > 1 else "faults-out")
    rows = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    if not rows:
        print(f"no figures in {folder}", file=sys.stderr)
        return 1
    for row in rows:
        row["succeeded"] = row.get("states", {}).get("succeeded", 0)
    print("| " + " | ".join(label for _, label in COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(str(row.get(key, "")) for key, _ in COLUMNS) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
