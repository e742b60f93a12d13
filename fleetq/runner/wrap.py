"""`python -m fleetq.runner.wrap STATUS -- ARGV...`: run a job's command and write its exit
status to a file.

Used in `--orphans adopt` mode, where a job may outlive the runner that launched it: a
restarted runner cannot wait() for a process it did not start, so the exit status must
be left where it can read it. Signals sent to the wrapper are passed on to the command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    """Run the command; write its status (negative: killed by that signal); exit alike."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m fleetq.runner.wrap STATUS -- ARGV...", file=sys.stderr)
        return 2
    status = Path(argv[0])
    try:
        child = subprocess.Popen(argv[2:])
    except OSError as exc:
        print(f"cannot run {argv[2]}: {exc.strerror}", file=sys.stderr)
        _write(status, 127)
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    code = child.wait()
    _write(status, code)
    return code if code >= 0 else 128 - code


def _write(status: Path, code: int) -> None:
    tmp = status.with_suffix(".tmp")
    tmp.write_text(f"{code}\n")
    os.replace(tmp, status)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
