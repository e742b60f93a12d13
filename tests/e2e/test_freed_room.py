"""A job that did not fit a runner is claimed the moment a job's end gives back the room
it needs, not at the runner's next poll: by the claim the outcome carries (its own
lane), or by a wake-up of the lane it waits in (memory and CPUs are the runner's, shared
by its lanes)."""

from __future__ import annotations

import re
import socket
import urllib.request
from pathlib import Path

import pytest

from fleetq.core.db import connect
from tests.e2e.conftest import Repo, StartRunner, job_state, wait_until
from tests.e2e.test_runner import _submit

# polls 30 s apart: a job claimed sooner was claimed by a job's end or a wake-up
SLOW_POLLS = ("--poll", "30", "--poll-max", "600")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _metric(port: int, name: str) -> float:
    """A counter's value (summed over its labels) from the runner's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


@pytest.mark.parametrize(
    "holder",
    ["until", "until_control"],
    ids=["the same lane (the outcome's claim)", "another lane (a wake-up)"],
)
def test_a_job_waiting_for_memory_runs_when_the_job_holding_it_ends(
    holder: str, fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: Path
) -> None:
    """Both jobs reserve 600 MB of the runner's 1,000, the waiting one in `checks`: the
    runner's claim for it (woken by its submit) finds it too big. When the holder ends,
    its room must be looked at once: by its outcome's claim when it ran in `checks`, by
    a wake-up of `checks` when it ran in `control` (its outcome's claim is of
    `control`, and `checks` would look only at its next poll)."""
    port = _free_port()
    start_runner(
        lanes=("checks=4", "control=4"),
        extra=("--memory-mb", "1000", "--metrics-port", str(port), *SLOW_POLLS),
    )
    holder_done, waiter_done = tmp_path / "holder", tmp_path / "waiter"
    with connect(fleet_dsn, autocommit=True) as conn:
        held = _submit(conn, holder, repo.head, payload={"path": str(holder_done)})
        # a handler's job stays "claimed" while it runs (it reports no start)
        wait_until(lambda: job_state(conn, held) == "claimed", what="the holding job")
        empty = _metric(port, "fleetq_empty_claims_total")
        waiter = _submit(conn, "until", repo.head, payload={"path": str(waiter_done)})
        wait_until(
            lambda: _metric(port, "fleetq_empty_claims_total") > empty,
            what="the runner's claim that found the waiting job too big",
        )
        assert job_state(conn, waiter) == "queued"
        holder_done.touch()
        wait_until(
            lambda: job_state(conn, waiter) == "claimed",
            what="the waiting job to be claimed as the holder ended (polls 30 s away)",
            deadline_s=15,
        )
        assert job_state(conn, held) == "succeeded"
        waiter_done.touch()
        wait_until(lambda: job_state(conn, waiter) == "succeeded", what="the waiting job")
