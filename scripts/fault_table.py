"""Render the fault suite's JSON figures (one file per scenario) as a Markdown table.

FLEETQ_FAULTS_OUT=faults-out uv run pytest -s tests/faults/test_scenarios.py
uv run python scripts/fault_table.py faults-out

Given several folders (one per run of the suite), it prints one row per scenario over
all of them: how many runs passed, and the median and worst of each figure.
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
    ("measured_overlap_s", "measured overlap s"),
    ("bounded_overlap_s", "bounded overlap s (at most)"),
    ("handler_reruns", "handler reruns"),
    ("proxy_resets", "resets"),
    ("submit_retries", "submit retries"),
    ("runner_starts", "runner starts"),
]


def main(argv: list[str]) -> int:
    if len(argv) > 2:
        return over_runs([Path(a) for a in argv[1:]])
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


NUMBERS = [
    "wall_s",
    "reassigned",
    "lost",
    "zombie_writes",
    "max_overlap_s",
    "measured_overlap_s",
    "bounded_overlap_s",
    "handler_reruns",
    "proxy_resets",
]


def over_runs(folders: list[Path]) -> int:
    """One row per scenario over several runs: passes, then "median / worst" figures. A
    scenario that failed wrote no JSON: it counts as a run that did not pass."""
    by: dict[str, list[dict[str, object]]] = {}
    for folder in folders:
        for p in sorted(folder.glob("*.json")):
            row = json.loads(p.read_text())
            by.setdefault(str(row["scenario"]), []).append(row)
    if not by:
        print("no figures in " + ", ".join(map(str, folders)), file=sys.stderr)
        return 1
    print("| scenario | passed | " + " | ".join(NUMBERS) + " |")
    print("|" + "---|" * (len(NUMBERS) + 2))
    for name, rows in sorted(by.items()):
        cells = []
        for key in NUMBERS:
            values = sorted(float(str(r.get(key, 0))) for r in rows)
            cells.append(f"{_num(values[len(values) // 2])} / {_num(values[-1])}")
        print(f"| {name} | {len(rows)}/{len(folders)} | " + " | ".join(cells) + " |")
    return 0


def _num(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:.2f}"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
