-- The scale and check-job benchmarks (bench/fleetq_bench/): what they read back from the
-- database, and the finished history they write into their scratch database. The
-- protocol calls they make are the runner's own blocks (leases.sql, runners.sql).

-- name: bench_scale_connections
-- Whether the server has room for one connection per simulated runner: its limit, the
-- slots kept for superusers, the client sessions open now (all databases), and whether
-- this login may use the reserved ones; and the server's version, for the report.
SELECT current_setting('server_version') AS server_version,
       current_setting('max_connections')::integer AS max_connections,
       current_setting('superuser_reserved_connections')::integer AS reserved,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend') AS in_use,
       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS superuser;

-- name: bench_scale_xids
-- The next transaction id to be assigned (reading it assigns none): its difference over
-- a window counts the transactions that wrote anything, on the whole server.
SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next_xid;

-- name: bench_scale_drain
-- A burst's figures from database time, for the jobs from id $1 on: submitted -> last
-- outcome, and the first to the last claim.
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
       extract(epoch FROM max(finished_at) - min(created_at))::float8 AS drain_s,
       extract(epoch FROM max(claimed_at) - min(claimed_at))::float8 AS claim_window_s
FROM fleetq.jobs WHERE id >= $1::bigint;

-- name: bench_scale_history
-- Finished history, fast: jobs $1..$2 (a batch) as the protocol leaves a succeeded job,
-- each with its execution, its four events (submitted, claimed, started, succeeded) and
-- its verdict, all on runner $3, project $4, operation $5, lane $6. Each job has its own
-- commit (as a check's history has), and they end an hour ago and earlier.
-- Data-modifying CTEs run to completion whether or not the outer query reads them.
WITH base AS (
    SELECT i, lpad(to_hex(i), 40, '0') AS commit_sha,
           clock_timestamp() - interval '1 hour' - make_interval(secs => ($2 - i) * 0.01) AS t
    FROM generate_series($1::bigint, $2::bigint) AS i
),
jobs AS (
    INSERT INTO fleetq.jobs
        (project, operation, commit_sha, lane, timeout_s, submitted_by, priority_class,
         state, lease_version, claim_id, released_by, released_version, released_kind,
         created_at, claimed_at, started_at, finished_at, updated_at)
    SELECT $4::text, $5::text, b.commit_sha, $6::text, 60, 'bench', 2,
           'succeeded', 1, gen_random_uuid(), $3::text, 1, 'outcome',
           b.t, b.t + interval '5 ms', b.t + interval '10 ms', b.t + interval '60 ms',
           b.t + interval '60 ms'
    FROM base b
    RETURNING id, commit_sha, created_at, claimed_at, started_at, finished_at
),
executions AS (
    INSERT INTO fleetq.executions
        (job_id, lease_version, runner_id, node, run_id, pid, process_started_at,
         prepared_at, launched_at, start_reported_at, ended_at, prepare_ms, run_ms, exit_code)
    SELECT j.id, 1, $3::text, split_part($3::text, '/', 1), gen_random_uuid(), 4242,
           j.started_at, j.started_at, j.started_at, j.started_at, j.finished_at, 5, 50, 0
    FROM jobs j
    RETURNING 1
),
events AS (
    INSERT INTO fleetq.events (at, kind, job_id, runner_id, lease_version, actor, detail)
    SELECT e.at, e.kind, j.id, e.runner_id, e.lease_version, e.actor, e.detail
    FROM jobs j
    CROSS JOIN LATERAL (VALUES
        (j.created_at, 'submitted', NULL, 0, 'bench', '{"priority_class": 2}'::jsonb),
        (j.claimed_at, 'claimed', $3::text, 1, NULL, '{}'::jsonb),
        (j.started_at, 'started', $3::text, 1, NULL,
         jsonb_build_object('pid', 4242, 'node', split_part($3::text, '/', 1))),
        (j.finished_at, 'succeeded', $3::text, 1, NULL, '{"reason": null, "exit_code": 0}'::jsonb)
    ) AS e(at, kind, runner_id, lease_version, actor, detail)
    RETURNING 1
),
verdicts AS (
    INSERT INTO fleetq.verdicts
        (job_id, project, commit_sha, operation, verdict, exit_code, log_tail, prepare_ms,
         run_ms, recorded_at)
    SELECT j.id, $4::text, j.commit_sha, $5::text, 'passed', 0, '', 5, 50, j.finished_at
    FROM jobs j
    RETURNING 1
)
SELECT count(*) AS jobs FROM jobs;

-- name: bench_scale_vacuum
-- After the history is written: visibility map and statistics, as autovacuum would
-- leave them (this statement cannot run inside a transaction block).
VACUUM (ANALYZE) fleetq.jobs, fleetq.executions, fleetq.events, fleetq.verdicts;

-- name: bench_scale_sizes
-- How much history the claim has to live with: finished jobs, and the jobs table's size
-- with its indexes and the queued-jobs index the claim walks, in bytes.
SELECT count(*) FILTER (WHERE finished_at IS NOT NULL) AS finished,
       pg_total_relation_size('fleetq.jobs') AS jobs_bytes,
       pg_relation_size('fleetq.jobs_queued') AS queued_index_bytes
FROM fleetq.jobs;

-- name: bench_checks_runs
-- What the check-job benchmark measures per job, in epoch seconds on the database's clock
-- (the jobs' commands print theirs on the same machine's clock): claimed, the start
-- report's arrival, the staging time the runner reported, and the command's output.
-- $1 job ids
SELECT j.id, j.state, j.commit_sha,
       extract(epoch FROM j.created_at)::float8 AS created,
       extract(epoch FROM j.claimed_at)::float8 AS claimed,
       extract(epoch FROM e.start_reported_at)::float8 AS start_reported,
       e.prepare_ms, v.log_tail
FROM fleetq.jobs j
LEFT JOIN fleetq.executions e ON e.job_id = j.id AND e.lease_version = j.lease_version
LEFT JOIN fleetq.verdicts v ON v.job_id = j.id
WHERE j.id = ANY ($1::bigint[])
ORDER BY j.id;

-- name: bench_scale_waits
-- What this database's busy sessions are doing now, the sampling session left out: each
-- wait event with how many sessions wait on it, 'CPU' for those running (or waiting to).
SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') AS wait, count(*) AS n
FROM pg_stat_activity
WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()
GROUP BY 1;

-- name: bench_scale_sessions
-- The server connections open to this database now, the sampling session left out: a
-- direct fleet's own, or the gateways' pools (through PgBouncer: its server connections)
-- and their LISTEN sessions.
SELECT count(*) AS n
FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND pid <> pg_backend_pid();
