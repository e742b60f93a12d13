"""A job that did not fit a runner is claimed the moment a job's end gives back the room
it needs, not at the runner's next poll: by the claim the outcome carries (its own
lane), or by a wake-up of the lane it waits in (memory and CPUs are the runner's, shared
by its lanes)."""

from __future__ import annotations

import re
import socket
import urllib.request
from pathlib import Path

from fleetq.core import producer
from fleetq.core.db import SyncConnection, connect
from tests.e2e.conftest import Repo, StartRunner, job_state, wait_until

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


def _submit(conn: SyncConnection, operation: str, commit: str, **payload: str) -> int:
    return producer.submit_in_transaction(
        conn,
        project="repo",
        operation=operation,
        commit=commit,
        submitted_by="tests",
        payload=payload or None,
    ).job_id


def test_a_job_that_did_not_fit_is_claimed_when_an_older_job_ends(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: Path
) -> None:
    """`until` jobs reserve 600 MB of the runner's 1,000: the second waits, and the
    runner's claim for it (woken by its submit) finds it too big. The first job's end
    gives the room back: its outcome's claim, or a wake-up of the lane, must take the
    second at once."""
    port = _free_port()
    start_runner(
        lanes=("checks=4",),
        extra=("--memory-mb", "1000", "--metrics-port", str(port), *SLOW_POLLS),
    )
    first_done, second_done = tmp_path / "first", tmp_path / "second"
    with connect(fleet_dsn, autocommit=True) as conn:
        first = _submit(conn, "until", repo.head, path=str(first_done))
        # a handler's job stays "claimed" while it runs (it reports no start)
        wait_until(lambda: job_state(conn, first) == "claimed", what="the first job")
        empty = _metric(port, "fleetq_empty_claims_total")
        second = _submit(conn, "until", repo.head, path=str(second_done))
        # announced to the whole lane (it fits no runner now): the runner looks, finds
        # nothing that fits, and knows it
        wait_until(
            lambda: _metric(port, "fleetq_empty_claims_total") > empty,
            what="the runner's claim that found the second job too big",
        )
        assert job_state(conn, second) == "queued"
        first_done.touch()
        wait_until(
            lambda: job_state(conn, second) == "claimed",
            what="the second job to be claimed as the first ended (its poll is 30 s away)",
            deadline_s=15,
        )
        assert job_state(conn, first) == "succeeded"
        second_done.touch()
        wait_until(lambda: job_state(conn, second) == "succeeded", what="the second job")


def test_a_job_waiting_for_memory_is_claimed_when_another_lane_s_job_ends(
    fleet_dsn: str, repo: Repo, start_runner: StartRunner, tmp_path: Path
) -> None:
    """The job holding the memory runs in `control`, the one waiting for it in `checks`:
    the outcome's claim is of `control` (and finds nothing), so only a wake-up of
    `checks` makes the waiting job run before that lane's next poll."""
    port = _free_port()
    start_runner(
        lanes=("checks=4", "control=4"),
        extra=("--memory-mb", "1000", "--metrics-port", str(port), *SLOW_POLLS),
    )
    holder_done, waiter_done = tmp_path / "holder", tmp_path / "waiter"
    with connect(fleet_dsn, autocommit=True) as conn:
        holder = _submit(conn, "until_control", repo.head, path=str(holder_done))
        wait_until(lambda: job_state(conn, holder) == "claimed", what="the control job")
        empty = _metric(port, "fleetq_empty_claims_total")
        waiter = _submit(conn, "until", repo.head, path=str(waiter_done))
        wait_until(
            lambda: _metric(port, "fleetq_empty_claims_total") > empty,
            what="the runner's claim of checks that found the job too big",
        )
        assert job_state(conn, waiter) == "queued"
        holder_done.touch()
        wait_until(
            lambda: job_state(conn, waiter) == "claimed",
            what="the checks job to be claimed as the control job ended (polls 30 s away)",
            deadline_s=15,
        )
        waiter_done.touch()
        wait_until(lambda: job_state(conn, waiter) == "succeeded", what="the checks job")
