"""Query plans that must hold however the data grows: the claim walks the queued index,
outcomes probe by key, and a bulk submit never joins its batch to itself."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence

import psycopg
import pytest

from fleetq.core import queries
from fleetq.core.db import SyncConnection, connect
from tests import factories, fleet


def _history(conn: SyncConnection) -> str:
    """20,000 finished jobs and 2,000 queued ones over two lanes; returns a runner id."""
    fleet.operations(conn)
    conn.execute(
        "INSERT INTO fleetq.jobs (project, operation, commit_sha, lane, timeout_s, submitted_by, "
        "priority_class, state, finished_at) SELECT 'tools', 'lint', $1, "
        "CASE WHEN i % 2 = 0 THEN 'checks' ELSE 'control' END, 60, 't', i % 3, "
        "CASE WHEN i <= 20000 THEN 'succeeded' ELSE 'queued' END, "
        "CASE WHEN i <= 20000 THEN clock_timestamp() END "
        "FROM generate_series(1, 22000) i",
        [factories.SHA],
    )
    conn.execute("ANALYZE fleetq.jobs")
    return factories.runner(conn, lanes={"checks": 4})


def _explained(conn: SyncConnection) -> list[str]:
    """From now on, every statement's plan on `conn`, nested ones included, appended to
    the list returned (auto_explain's notices)."""
    plans: list[str] = []
    conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
    for setting in (
        "auto_explain.log_min_duration = 0",
        "auto_explain.log_nested_statements = on",
        "auto_explain.log_level = notice",
        "client_min_messages = notice",
    ):
        conn.execute(f"SET {setting}".encode())
    conn.execute(b"LOAD 'auto_explain'")
    return plans


def _outcomes(conn: SyncConnection, runner: str, claimed: list[tuple[int, int]]) -> list[str]:
    """Succeed `claimed` ((job, token) pairs) through the runner's outcome call; the
    answers."""
    n = len(claimed)
    nulls: list[None] = [None] * n
    rows = conn.execute(
        queries.sql("lease_complete"),
        [
            runner,
            [c[0] for c in claimed],
            [c[1] for c in claimed],
            ["succeeded"] * n,
            [0] * n,
            nulls,
            [""] * n,
            nulls,
            nulls,
            nulls,
            nulls,
        ],
    ).fetchall()
    return [str(r[1]) for r in rows]


def test_claim_walks_the_queued_index(db_dsn: str) -> None:
    with connect(db_dsn, autocommit=True) as conn:
        runner = _history(conn)
        plans = _explained(conn)
        claimed = conn.execute(
            queries.sql("lease_claim"), [runner, "checks", 4, uuid.uuid4()]
        ).fetchall()
        assert len(claimed) == 4
    candidate_plans = [p for p in plans if "WITH candidates AS" in p]
    assert candidate_plans, plans
    assert any("Index Scan using jobs_queued on jobs" in p for p in candidate_plans), (
        candidate_plans
    )
    assert not any("Seq Scan on jobs" in p for p in candidate_plans), candidate_plans


def test_auto_explain_is_available(db_dsn: str) -> None:
    """The plan test above depends on auto_explain; say so plainly if a server lacks it."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("LOAD 'auto_explain'")


def test_outcomes_read_jobs_by_key_while_the_tables_are_small(db_dsn: str) -> None:
    """A runner's connection caches its plans. Planned while `jobs` is small (a fresh
    queue, the first seconds of a burst), the outcome path chose sequential scans and hash
    joins, then read the whole table on every call once it had grown (the benchmark's
    20,000-job backlog: each outcome batch scanned every job, four times). So the outcome
    path is told to probe by key at any size, and never to compile with JIT."""
    with connect(db_dsn, autocommit=True) as conn:
        runner = factories.runner(conn, lanes={"checks": 4})
        op = factories.operation(conn)
        for _ in range(4):
            factories.job(conn, op=op)
        claimed = conn.execute(
            queries.sql("lease_claim"), [runner, "checks", 4, uuid.uuid4()]
        ).fetchall()
        assert len(claimed) == 4
        plans = _explained(conn)
        n = len(claimed)
        answers = _outcomes(conn, runner, [(int(c[0]), int(c[1])) for c in claimed])
    assert answers == ["ok"] * n
    assert len(plans) > 5, plans  # every statement of the outcome path was explained
    whole_reads = [
        p
        for p in plans
        if any(f"Seq Scan on {t} " in p for t in ("jobs", "executions", "verdicts"))
        or "Hash Join" in p
        or "Merge Join" in p
    ]
    assert not whole_reads, whole_reads
    # the update that ends the jobs probes each by its id from the batch: led by the
    # locked ids instead, it read the whole batch again for each job (a batch of 64:
    # 4,096 rows a call; the benchmark's server CPU per job rose by half)
    (ending,) = [p for p in plans if "released_kind = 'outcome'" in p and "Update on" in p]
    assert "Index Cond: (id = i.id)" in ending, ending
    assert not [p for p in plans if "JIT:" in p], "a plan was compiled with JIT"
    # planned once for any jobs, not again for these: a plan made for this call's arrays
    # shows their values in its conditions ('{1,2,3,4}'); a generic one, parameters ($1).
    # (PostgreSQL 18 also lists the top statement's parameter values: not a plan's.)
    ids = "{" + ",".join(str(c[0]) for c in claimed) + "}"
    for_these = [
        line
        for p in plans
        for line in p.splitlines()
        if f"'{ids}'" in line and ("Cond:" in line or "Filter:" in line)
    ]
    assert not for_these, for_these


def test_a_claim_asks_whether_its_runner_is_stale_once_not_per_job(db_dsn: str) -> None:
    """The candidate scan evaluates its filter on every queued job it passes. A runner's
    staleness (a settings read and the clock) belongs to the runner, not to the job:
    computed inside the filter it cost a query per job looked at, 70,000 per
    20,000-job backlog."""
    with connect(db_dsn, autocommit=True) as conn:
        runner = factories.runner(conn, lanes={"checks": 4})
        gpu = factories.operation(conn, name="gpu", capabilities=("gpu",))
        plain = factories.operation(conn, name="plain")
        for _ in range(50):  # first in line, and not this runner's to take
            factories.job(conn, op=gpu, priority_class=0)
        for _ in range(4):
            factories.job(conn, op=plain)
        conn.execute(b"SET track_functions = 'all'")
        conn.execute(b"BEGIN")
        claimed = conn.execute(
            queries.sql("lease_claim"), [runner, "checks", 4, uuid.uuid4()]
        ).fetchall()
        (calls,) = conn.execute(  # runner_is_stale is inlined: count its settings read
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions "
            "WHERE schemaname = 'fleetq' AND funcname = 'setting_int'"
        ).fetchone() or (None,)
        conn.execute(b"COMMIT")
    assert len(claimed) == 4
    # the lease's length, and the staleness before the scan and under the lock
    assert calls is not None and calls <= 3, calls


def test_outcomes_never_walk_every_job_ever_claimed(db_dsn: str) -> None:
    """The outcome update names its jobs by key. Its fence (owner, token, a live lease)
    said as state IN ('claimed', 'running') also matched the partial index of claimed
    and running jobs, and planned on the statistics of a fresh queue (few jobs claimed,
    as a runner's first calls see them) each call read that index whole: every entry a
    claim has left there since the last VACUUM, so each outcome batch cost more than the
    one before (0.4 ms more per call after 6,000 jobs; at 256 jobs a batch, 0.155 ms of
    server CPU per job instead of 0.100, scripts/call_costs.py)."""
    with connect(db_dsn, autocommit=True) as conn:
        runner = factories.runner(conn, lanes={"checks": 1000})
        op = factories.operation(conn)
        for _ in range(40):
            factories.job(conn, op=op)
        conn.execute("ANALYZE fleetq.jobs")  # statistics of a fresh queue, nothing claimed
        for _ in range(4):  # the runner's connection plans its calls on its first ones
            taken = conn.execute(
                queries.sql("lease_claim"), [runner, "checks", 10, uuid.uuid4()]
            ).fetchall()
            pairs = [(int(t[0]), int(t[1])) for t in taken]
            conn.execute(
                queries.sql("lease_heartbeat"),
                [runner, [p[0] for p in pairs], [p[1] for p in pairs]],
            ).fetchall()
            assert _outcomes(conn, runner, pairs) == ["ok"] * len(pairs)
        factories.job(conn, op=op)
        ((job, token),) = [
            (int(r[0]), int(r[1]))
            for r in conn.execute(
                queries.sql("lease_claim"), [runner, "checks", 1, uuid.uuid4()]
            ).fetchall()
        ]
        plans = _explained(conn)
        beat = conn.execute(queries.sql("lease_heartbeat"), [runner, [job], [token]]).fetchall()
        assert [r[1] for r in beat] == ["ok"]
        assert _outcomes(conn, runner, [(job, token)]) == ["ok"]
    assert len(plans) > 5, plans
    walks = [p for p in plans if "jobs_claim_id" in p or "jobs_lease_expiry" in p]
    assert not walks, walks


def test_a_claim_plans_what_it_takes_once_per_connection(db_dsn: str) -> None:
    """A claim's second stage (take the held jobs, under the runner's lock) probes them
    by key whatever the values. PostgreSQL chose per connection, from its first five
    calls' costs, between planning it once and planning it again on every call for the
    call's own values, which cost more than running it (0.55 ms a claim of one job, on
    PostgreSQL 15 in scripts/call_costs.py's cycle); a change elsewhere in the claim
    flipped the choice. Its plan is the generic one, whatever PostgreSQL would choose:
    here the session asks for plans made per call, and it still gets the generic one."""
    with connect(db_dsn, autocommit=True) as conn:
        runner = factories.runner(conn, lanes={"checks": 4})
        op = factories.operation(conn)
        for _ in range(3):
            factories.job(conn, op=op)
        conn.execute(b"SET plan_cache_mode = force_custom_plan")
        plans = _explained(conn)
        claimed = conn.execute(
            queries.sql("lease_claim"), [runner, "checks", 3, uuid.uuid4()]
        ).fetchall()
    assert len(claimed) == 3
    taking = [p for p in plans if "The held jobs that still qualify" in p]
    assert taking, plans
    ids = "{" + ",".join(str(i) for i in sorted(int(c[0]) for c in claimed)) + "}"
    assert not [p for p in taking if f"'{ids}'" in p], taking


@pytest.mark.parametrize("plans_made", ["force_generic_plan", "force_custom_plan"])
def test_a_bulk_submit_never_joins_its_batch_to_itself(db_dsn: str, plans_made: str) -> None:
    """A join's plan rests on estimates, and PostgreSQL's for an unnest of an array
    parameter is a guess: 10 rows in a generic plan, which it may keep from a
    connection's sixth call on. The bulk submit joined its new jobs to their input rows,
    by a nested loop under that guess: quadratic in the batch (5,000 jobs took 2.6 s
    instead of 0.3). A plan made for the call's own arrays knew the batch and not the
    table: it answered keys already used by sorting every job for a merge join (8,000
    keys among a million jobs never analyzed: 0.7 s, against 0.2 to 0.3 probed). So,
    whichever plans the session asks for: no statement of a bulk submit joins the batch's
    rows to one another, and a key already used is found by a probe of the key's index."""
    n = 300
    nulls: list[None] = [None] * n
    with connect(db_dsn, autocommit=True) as conn:
        factories.operation(conn)
        conn.execute(  # a history the keys' probes must not walk (never analyzed)
            "INSERT INTO fleetq.jobs (project, operation, commit_sha, lane, timeout_s, "
            "submitted_by, priority_class, state, finished_at) SELECT 'webapp', 'unit', $1, "
            "'checks', 60, 't', 2, 'succeeded', clock_timestamp() FROM generate_series(1, 20000)",
            [factories.SHA],
        )

        def submit_many(keys: Sequence[str | None]) -> list[tuple[object, ...]]:
            columns = [["webapp"] * n, ["unit"] * n, [factories.SHA] * n, nulls, list(keys), nulls]
            return conn.execute(
                queries.sql("jobs_submit_many"), [*columns, ["{}"] * n, nulls, "ci"]
            ).fetchall()

        conn.execute(f"SET plan_cache_mode = {plans_made}".encode())
        plans = _explained(conn)
        fresh = submit_many(nulls)
        # half the keys used already: those rows answer the jobs their keys name
        again = submit_many([f"k{i}" for i in range(n // 2)] * 2)
        repeated = submit_many([f"k{i}" for i in range(n)])
    assert [row[1] for row in fresh] == [True] * n
    assert [row[1] for row in again] == [True] * (n // 2) + [False] * (n // 2)
    assert [row[0] for row in again[n // 2 :]] == [row[0] for row in again[: n // 2]]
    assert [row[1] for row in repeated] == [False] * (n // 2) + [True] * (n // 2)
    assert [row[0] for row in repeated[: n // 2]] == [row[0] for row in again[: n // 2]]
    inserts = [p for p in plans if "Insert on events" in p]
    assert len(inserts) == 3, plans
    # the new jobs met their input rows row by row: "Join Filter: (nb.id = m.id)"
    self_joins = [p for p in plans if re.search(r"(Filter|Cond): \((nb|m|i)\w*\.(id|n) ", p)]
    assert not self_joins, self_joins
    key_reads = [p for p in plans if " on jobs j" in p]
    assert len(key_reads) >= 4, plans  # the check and the answer, twice
    probe = re.compile(
        r"Index Cond: \(\(project = i\.project\) AND \(submitted_by = [^)]*\) "
        r"AND \(idempotency_key = i\.key\)\)"
    )
    walks = [p for p in key_reads if not probe.search(p) or "Seq Scan on jobs" in p]
    assert not walks, walks


def test_the_reaper_finds_expired_leases_by_their_index(db_dsn: str) -> None:
    """The expiry scan reads the live leases' partial index (state claimed or running),
    not every job ever run: its state condition is what lets it."""
    with connect(db_dsn, autocommit=True) as conn:
        runner = _history(conn)
        conn.execute(queries.sql("lease_claim"), [runner, "checks", 4, uuid.uuid4()])
        plans = _explained(conn)
        conn.execute(b"SELECT * FROM fleetq.reap(1000, clock_timestamp() + interval '1 day')")
    expiry = [p for p in plans if "j.lease_expires_at < coalesce(p_now" in p]
    assert expiry, plans
    assert any("jobs_lease_expiry" in p for p in expiry), expiry
    assert not any("Seq Scan on jobs" in p for p in expiry), expiry
