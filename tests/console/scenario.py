"""A deterministic fleet for console tests and screenshots: fixed ids, fixed times, a
pinned clock. Rows are written by the factories (and a few direct inserts of events and
executions, the history a real fleet would have left), so every view has something true
to show: a finished job whose two executions overlapped (the older stopped as
superseded, its stop confirmed), a job no runner can take, a pending stop, an offline and
a draining runner, and a failure whose text tries to inject markup and escape codes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from psycopg.types.json import Jsonb

from fleetq.core.db import SyncConnection
from tests import factories

CLOCK = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
HOSTILE = "[/bold] boom [red]not red[/red] \x1b[31mESC\x1b[0m \x1b]0;pwned\x07 done"


def at(seconds: float) -> datetime:
    """CLOCK + seconds (negative: before)."""
    return CLOCK + timedelta(seconds=seconds)


def build(conn: SyncConnection) -> dict[str, int]:
    """Write the scenario; returns the job ids by name."""
    # Offline is decided from the pinned heartbeats by state only: the real clock is far
    # from CLOCK, so the heartbeat-age rule is switched off for the scenario.
    conn.execute(
        "UPDATE fleetq.settings SET value = '315360000' WHERE name = 'runner_offline_after_seconds'"
    )
    factories.lane(conn, "checks")
    factories.lane(conn, "control")
    factories.project(conn, "webapp", release_gate=True)
    factories.project(conn, "tools")
    unit = factories.operation(conn, "webapp", "unit", memory_mb=1024, cpu_millis=1000)
    browser = factories.operation(
        conn, "webapp", "browser", capabilities=("browser",), memory_mb=4096, cpu_millis=2000
    )
    lint = factories.operation(conn, "tools", "lint", memory_mb=256, cpu_millis=500)
    notify = factories.operation(conn, "webapp", "notify", lane_name="control")

    build1 = factories.runner(
        conn,
        "build-1",
        "r1",
        lanes={"checks": 2, "control": 1},
        capabilities=("linux",),
        memory_mb=8192,
        cpu_millis=4000,
    )
    gpu1 = factories.runner(
        conn,
        "gpu-1",
        "r1",
        lanes={"checks": 1},
        capabilities=("linux", "browser"),
        memory_mb=2048,
        cpu_millis=2000,
    )
    edge1 = factories.runner(
        conn,
        "edge-1",
        "r1",
        lanes={"checks": 1},
        capabilities=("linux",),
        memory_mb=4096,
        cpu_millis=2000,
        state="draining",
    )
    old1 = factories.runner(
        conn,
        "old-1",
        "r1",
        lanes={"checks": 1},
        memory_mb=4096,
        cpu_millis=2000,
        state="offline",
    )
    for runner, beat, changed, reason, actor in (
        (build1, -2, -3600, None, None),
        (gpu1, -4, -3600, None, None),
        (edge1, -1, -300, "kernel update", "alice"),
        (old1, -900, -900, "heartbeat lost", None),
    ):
        conn.execute(
            "UPDATE fleetq.runners SET last_heartbeat_at = $2, state_changed_at = $3, "
            "state_reason = $4, state_actor = $5 WHERE id = $1",
            [runner, at(beat), at(changed), reason, actor],
        )

    ids: dict[str, int] = {}
    # 1: finished long ago, with a clean single execution.
    ids["done"] = factories.job(
        conn,
        op=unit,
        state="succeeded",
        lease_version=1,
        submitted_by="ci",
        created_at=at(-1500),
        claimed_at=at(-1499),
        started_at=at(-1498),
        finished_at=at(-1440),
        priority_class=1,
    )
    # 2: the overlap: t1 on edge-1 went silent, its lease expired, build-1 claimed t2;
    # edge-1 came back, saw it was superseded, and its stop was confirmed 9 s into t2.
    ids["overlap"] = factories.job(
        conn,
        op=unit,
        state="succeeded",
        lease_version=2,
        reassign_count=1,
        submitted_by="ci",
        created_at=at(-130),
        claimed_at=at(-60),
        started_at=at(-58),
        finished_at=at(-20),
        priority_class=1,
    )
    # 3: no runner can take it (4 GB; the only browser runner has 2 GB).
    ids["unplaceable"] = factories.job(
        conn, op=browser, submitted_by="release-bot", priority_class=0, created_at=at(-240)
    )
    # 4: running on build-1, lease 20 s from now.
    ids["running"] = factories.job(
        conn,
        op=lint,
        state="running",
        owner=build1,
        reserved_on=build1,
        lease_version=1,
        submitted_by="ci",
        created_at=at(-50),
        claimed_at=at(-45),
        started_at=at(-44),
        lease_expires_at=at(20),
    )
    # 5: cancelled while running on build-1: stop pending until build-1 confirms.
    ids["stopping"] = factories.job(
        conn,
        op=lint,
        state="cancelled",
        reserved_on=build1,
        lease_version=1,
        submitted_by="ci",
        created_at=at(-40),
        claimed_at=at(-39),
        started_at=at(-38),
        finished_at=at(-5),
        cancelled_by="alice",
    )
    # 6-8: queued lint jobs, eligible now.
    for n in range(3):
        ids[f"queued{n}"] = factories.job(
            conn, op=lint, submitted_by="ci", created_at=at(-30 + n * 5), payload={"n": n}
        )
    # 9: failed, and its output tries markup and terminal escapes.
    ids["hostile"] = factories.job(
        conn,
        op=unit,
        state="failed",
        lease_version=1,
        submitted_by="ci",
        created_at=at(-600),
        claimed_at=at(-598),
        started_at=at(-597),
        finished_at=at(-540),
        failure_reason=HOSTILE,
        payload={"name": HOSTILE},
    )
    # 10: a control job.
    ids["control"] = factories.job(
        conn,
        op=notify,
        state="succeeded",
        lease_version=1,
        submitted_by="release-bot",
        created_at=at(-100),
        claimed_at=at(-100),
        finished_at=at(-99),
        priority_class=0,
    )
    conn.execute(
        "UPDATE fleetq.runner_lanes SET slots_used = 2 WHERE runner_id = $1 AND lane = 'checks'",
        [build1],
    )
    conn.execute(
        "UPDATE fleetq.runners SET reserved_memory_mb = 512, reserved_cpu_millis = 1000 "
        "WHERE id = $1",
        [build1],
    )
    conn.execute(
        "INSERT INTO fleetq.verdicts (project, commit_sha, operation, job_id, verdict, exit_code, "
        "reason, log_tail, recorded_at) VALUES ('webapp', $1, 'unit', $2, 'failed', 1, 'exit', "
        "$3, $4)",
        [factories.SHA, ids["hostile"], f"collected 12 items\n{HOSTILE}\nFAILED test_x", at(-540)],
    )

    overlap = ids["overlap"]
    _execution(
        conn,
        overlap,
        1,
        edge1,
        claimed=-120,
        launched=-118,
        stop_requested=-50,
        ended=-49,
        stop_reason="superseded",
        confirmed=True,
        signal=15,
    )
    _execution(conn, overlap, 2, build1, claimed=-60, launched=-58, ended=-20, exit_code=0)
    _execution(conn, ids["running"], 1, build1, claimed=-45, launched=-44)
    _execution(conn, ids["stopping"], 1, build1, claimed=-39, launched=-38, stop_requested=-5)
    _execution(conn, ids["hostile"], 1, gpu1, claimed=-598, launched=-597, ended=-540, exit_code=1)
    _execution(
        conn, ids["done"], 1, build1, claimed=-1499, launched=-1498, ended=-1440, exit_code=0
    )

    history: list[
        tuple[int, str, int | None, str | None, int | None, str | None, dict[str, object]]
    ] = [
        (-1500, "submitted", ids["done"], None, 0, "ci", {"priority_class": 1}),
        (-1499, "claimed", ids["done"], build1, 1, None, {}),
        (-1498, "started", ids["done"], build1, 1, None, {}),
        (-1440, "succeeded", ids["done"], build1, 1, None, {"exit_code": 0}),
        (-600, "submitted", ids["hostile"], None, 0, "ci", {"priority_class": 2}),
        (-598, "claimed", ids["hostile"], gpu1, 1, None, {}),
        (-540, "failed", ids["hostile"], gpu1, 1, None, {"reason": HOSTILE}),
        (-240, "submitted", ids["unplaceable"], None, 0, "release-bot", {"priority_class": 0}),
        (-130, "submitted", overlap, None, 0, "ci", {"priority_class": 1}),
        (-120, "claimed", overlap, edge1, 1, None, {}),
        (-118, "started", overlap, edge1, 1, None, {}),
        (-61, "lease_expired", overlap, edge1, 1, None, {"requeued": True}),
        (-60, "claimed", overlap, build1, 2, None, {}),
        (-58, "started", overlap, build1, 2, None, {}),
        (-55, "stale_rejected", overlap, edge1, 1, None, {"write": "heartbeat"}),
        (-49, "stopped", overlap, edge1, 1, None, {"reason": "superseded", "signal": 15}),
        (-20, "succeeded", overlap, build1, 2, None, {"exit_code": 0}),
        (-45, "claimed", ids["running"], build1, 1, None, {}),
        (-44, "started", ids["running"], build1, 1, None, {}),
        (-5, "cancelled", ids["stopping"], build1, 1, "alice", {"reason": "wrong commit"}),
        (-300, "runner_draining", None, edge1, None, "alice", {"reason": "kernel update"}),
    ]
    for offset, kind, job, who, token, actor, detail in sorted(history, key=lambda h: h[0]):
        conn.execute(
            "INSERT INTO fleetq.events (at, kind, job_id, runner_id, lease_version, actor, "
            "detail) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            [at(offset), kind, job, who, token, actor, Jsonb(detail)],
        )
    conn.execute("UPDATE fleetq.runners SET stale_rejections = 1 WHERE id = $1", [edge1])
    _queue_history(conn)
    _schedules(conn, ids["queued0"])
    return ids


def _schedules(conn: SyncConnection, fired: int) -> None:
    """A nightly schedule that fired `fired` at 02:00 Berlin time, and a paused hourly one."""
    conn.execute(
        "INSERT INTO fleetq.schedules (name, cron, timezone, project, operation, commit_sha, "
        "branch, last_tick, paused_at, paused_by, paused_reason) VALUES "
        "('nightly', '0 2 * * *', 'Europe/Berlin', 'tools', 'lint', $1, NULL, $2, NULL, NULL, "
        "NULL), ('hourly', '0 * * * *', 'UTC', 'webapp', 'unit', NULL, 'main', $3, $3, 'ops', "
        "'repository moving')",
        [factories.SHA, datetime(2026, 11, 29, 1, 0, tzinfo=UTC), at(-3600)],
    )
    conn.execute(
        "INSERT INTO fleetq.schedule_ticks (schedule, tick, job_id, fired_at) "
        "VALUES ('nightly', $1, $2, $1)",
        [datetime(2026, 11, 29, 1, 0, tzinfo=UTC), fired],
    )


def _queue_history(conn: SyncConnection) -> None:
    """An hour of minute samples for lane checks: class 1 built up to 18 queued 25 min ago
    and drained, class 2 kept one; nothing was sampled 50 to 46 min ago (no runner
    ran), and lane control stayed empty."""
    for minutes_ago in range(60):
        if 46 <= minutes_ago <= 50:
            continue
        minute = CLOCK - timedelta(minutes=minutes_ago)
        build_up = max(0, 18 - abs(minutes_ago - 25)) if 10 <= minutes_ago <= 40 else 0
        rows = [
            ("checks", 0, 0, 0, None),
            ("checks", 1, build_up, 2 if build_up else 1, 6.0 * build_up if build_up else 2.0),
            ("checks", 2, 1, 1, 30.0),
            ("control", 0, 0, 0, None),
            ("control", 1, 0, 0, None),
            ("control", 2, 0, 0, None),
        ]
        for lane, cls, queued, claimed, wait in rows:
            conn.execute(
                "INSERT INTO fleetq.queue_samples (at, lane, priority_class, queued, "
                "oldest_wait_s, claimed, wait_p50_s, wait_max_s) "
                "VALUES ($1, $2, $3, $4, $5, $6, $7, $7)",
                [minute, lane, cls, queued, wait if queued else None, claimed, wait],
            )


def _execution(
    conn: SyncConnection,
    job: int,
    token: int,
    runner: str,
    *,
    claimed: float,
    launched: float,
    ended: float | None = None,
    stop_requested: float | None = None,
    stop_reason: str | None = None,
    confirmed: bool = False,
    exit_code: int | None = None,
    signal: int | None = None,
) -> None:
    del claimed  # the claim time lives in the `claimed` event
    # an end the runner recorded (outcome or confirmed stop) was dated on its clock
    conn.execute(
        "INSERT INTO fleetq.executions (job_id, lease_version, runner_id, node, run_id, pid, "
        "launched_at, start_reported_at, ended_at, stop_requested_at, stop_reason, "
        "stop_confirmed, exit_code, signal, end_measured) "
        "VALUES ($1, $2, $3, split_part($3, '/', 1), $4, 4242, $5, $5, $6, $7, $8, $9, $10, $11, "
        "$6::timestamptz IS NOT NULL)",
        [
            job,
            token,
            runner,
            uuid.UUID(int=job * 100 + token),
            at(launched),
            at(ended) if ended is not None else None,
            at(stop_requested) if stop_requested is not None else None,
            stop_reason,
            confirmed,
            exit_code,
            signal,
        ],
    )
