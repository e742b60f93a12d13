"""The runner makes itself non-dumpable (issue 13), so a job of its own uid cannot read
its /proc files (environ: the DSN; mem); a job's own exec is dumpable again."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import ctypes, subprocess, sys
from fleetq.runner import orphans, main
before = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
{call}
after = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)
child = subprocess.run([sys.executable, "-c",
    "import ctypes; print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))"],
    capture_output=True, text=True).stdout.strip()
print(before, after, child)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_the_runner_entry_point_makes_the_process_undumpable() -> None:
    """`fleetq-runner` calls it first thing (a --help run is enough to get there)."""
    call = "import contextlib\nwith contextlib.suppress(SystemExit): main.main(['--help'])"
    out = subprocess.run(
        [sys.executable, "-c", CHECK.format(call=call)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[-3:] == ["1", "0", "1"], out  # dumpable, then not; its children are again
