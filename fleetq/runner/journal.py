"""The runner's local run journal: what it launched, written down before launching.

Why: a runner can die between claiming a job and its start report reaching the
database. On restart, the database says "you hold job 42, token 3" and nothing more; the
journal says whether a process was launched for it, under which run id, so the collection
pass can tell "launched nothing" from "launched something that may still be around".

One JSON line per record, appended and fsynced (so it survives kill -9 of the runner):
`launch` before the process starts, `pid` once it runs, `end` once its outcome or stop is
recorded. Reading folds the lines into the open entries; `compact` rewrites the file with
only those.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from fleetq.runner.private import open_private


@dataclass(frozen=True)
class Entry:
    """A launch the runner has not yet seen recorded."""

    job_id: int
    token: int
    run_id: str
    pid: int | None = None
    started_at: float | None = None  # process start time (psutil create_time)
    tree: str | None = None  # the staged source tree, for cleaning up after a crash
    birth: str | None = None  # boot and start in ticks (orphans.birth); None from older runners


class Journal:
    """An append-only, fsynced JSON-lines file per runner."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # private: jobs may not read what the runner launched (issue 41); its directory
        # is the runner's, which job users may pass through (see jobuser), not list
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.exists():
            path.chmod(0o600)

    def launching(self, job_id: int, token: int, run_id: str, tree: str | None = None) -> None:
        """Before launching: the run id the process will carry in FLEETQ_RUN_ID, and
        where its tree is staged."""
        self._append(
            {"op": "launch", "job_id": job_id, "token": token, "run_id": run_id, "tree": tree}
        )

    def launched(
        self, job_id: int, token: int, pid: int, started_at: float, birth: str | None
    ) -> None:
        """Once the process runs: pid and birth identify it across pid reuse (the start
        time is what the start report says)."""
        self._append(
            {
                "op": "pid",
                "job_id": job_id,
                "token": token,
                "pid": pid,
                "started_at": started_at,
                "birth": birth,
            }
        )

    def ended(self, job_id: int, token: int) -> None:
        """The outcome or stop was recorded: nothing left to collect."""
        self._append({"op": "end", "job_id": job_id, "token": token})

    def open_entries(self) -> dict[tuple[int, int], Entry]:
        """Launches with no `end`, by (job, token). A torn last line (the runner died
        mid-write) is ignored: its launch had not begun."""
        entries: dict[tuple[int, int], Entry] = {}
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return entries
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            key = (int(record["job_id"]), int(record["token"]))
            if record["op"] == "launch":
                entries[key] = Entry(
                    job_id=key[0], token=key[1], run_id=record["run_id"], tree=record.get("tree")
                )
            elif record["op"] == "pid" and key in entries:
                entries[key] = Entry(
                    **{
                        **asdict(entries[key]),
                        "pid": record["pid"],
                        "started_at": record["started_at"],
                        "birth": record.get("birth"),
                    }
                )
            elif record["op"] == "end":
                entries.pop(key, None)
        return entries

    def compact(self) -> None:
        """Rewrite the file with only the open entries (atomically)."""
        tmp = self.path.with_suffix(".tmp")
        with open(open_private(tmp), "w") as f:
            for e in self.open_entries().values():
                f.write(
                    json.dumps(
                        {
                            "op": "launch",
                            "job_id": e.job_id,
                            "token": e.token,
                            "run_id": e.run_id,
                            "tree": e.tree,
                        }
                    )
                    + "\n"
                )
                if e.pid is not None:
                    f.write(
                        json.dumps(
                            {
                                "op": "pid",
                                "job_id": e.job_id,
                                "token": e.token,
                                "pid": e.pid,
                                "started_at": e.started_at,
                                "birth": e.birth,
                            }
                        )
                        + "\n"
                    )
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)

    def _append(self, record: dict[str, object]) -> None:
        with open(open_private(self.path, append=True), "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
