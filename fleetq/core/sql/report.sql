-- A run's figures (`fleetq demo`'s report): the same measurements as `fleetq stats`, but
-- of one set of jobs only ($1, the ids a run submitted), so earlier runs in the same
-- database never leak into a run's verdict.

-- name: report_clock
-- The database's clock: fault times are read here, so they compare with event times
-- even when the server is another machine.
SELECT clock_timestamp() AS now;

-- name: report_states
-- Jobs by state and failure reason. An id missing from every row was lost.
-- $1 job ids
SELECT state, coalesce(failure_reason, '') AS reason, count(*) AS jobs
FROM fleetq.jobs
WHERE id = ANY ($1::bigint[])
GROUP BY state, coalesce(failure_reason, '')
ORDER BY state, reason;

-- name: report_live
-- Jobs not yet terminal, with their current execution when one was launched (the newest
-- launch first): the demo picks its fault victim and the job to cancel from here.
-- $1 job ids
SELECT j.id AS job_id, j.project, j.operation, j.state, j.lease_owner, j.lease_version,
       x.launched_at,
       extract(epoch FROM clock_timestamp() - x.launched_at)::float8 AS running_s
FROM fleetq.jobs j
LEFT JOIN fleetq.all_executions x ON x.job_id = j.id AND x.lease_version = j.lease_version
WHERE j.id = ANY ($1::bigint[]) AND j.state IN ('queued', 'claimed', 'running')
ORDER BY x.launched_at DESC NULLS LAST, j.id;

-- name: report_queue_wait
-- Queue wait by priority class and project: submit to *first* claim, so a job claimed
-- again after a fault waits once (the second wait is recovery, measured apart).
-- $1 job ids
SELECT j.priority_class, j.project, count(*) AS jobs,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM c.at - j.created_at))
           AS p50_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM c.at - j.created_at))
           AS p95_s,
       max(extract(epoch FROM c.at - j.created_at))::float8 AS max_s
FROM fleetq.jobs j
CROSS JOIN LATERAL (
    SELECT min(e.at) AS at FROM fleetq.events e WHERE e.job_id = j.id AND e.kind = 'claimed'
) c
WHERE j.id = ANY ($1::bigint[]) AND c.at IS NOT NULL
GROUP BY j.priority_class, j.project
ORDER BY j.priority_class, j.project;

-- name: report_phases
-- Prepare (staging the commit) apart from run time, per operation, over every execution
-- that launched (handlers have no prepare phase: NULL).
-- $1 job ids
SELECT j.operation, count(*) AS runs,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY x.prepare_ms) AS prepare_p50_ms,
       max(x.prepare_ms) AS prepare_max_ms,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY x.run_ms) AS run_p50_ms,
       max(x.run_ms) AS run_max_ms
FROM fleetq.executions x
JOIN fleetq.jobs j ON j.id = x.job_id
WHERE x.job_id = ANY ($1::bigint[]) AND x.launched_at IS NOT NULL
GROUP BY j.operation
ORDER BY j.operation;

-- name: report_placement
-- Where the run's jobs were claimed, per runner and operation: eligibility at work (a
-- browser check is never claimed by a runner without the capability). Claims, not
-- executions, so handler jobs count too.
-- $1 job ids
SELECT e.runner_id, j.operation, count(*) AS claims
FROM fleetq.events e
JOIN fleetq.jobs j ON j.id = e.job_id
WHERE e.job_id = ANY ($1::bigint[]) AND e.kind = 'claimed'
GROUP BY e.runner_id, j.operation
ORDER BY e.runner_id, j.operation;

-- name: report_completed
-- Jobs completed (an outcome: succeeded or failed) per interval since the run began.
-- Empty intervals are listed too, so a stall shows as a zero, not as a gap; at most the
-- first 1000 intervals (a report, not a time series).
-- $1 job ids, $2 run start, $3 interval in seconds
WITH done AS (
    SELECT floor(extract(epoch FROM finished_at - $2::timestamptz) / $3::float8)::integer
               AS bucket,
           state
    FROM fleetq.jobs
    WHERE id = ANY ($1::bigint[]) AND state IN ('succeeded', 'failed')
)
SELECT b.bucket,
       count(d.state) FILTER (WHERE d.state = 'succeeded') AS succeeded,
       count(d.state) FILTER (WHERE d.state = 'failed') AS failed
FROM generate_series(0, least(999, greatest(0, (SELECT max(bucket) FROM done)))) AS b(bucket)
LEFT JOIN done d ON d.bucket = b.bucket
GROUP BY b.bucket
ORDER BY b.bucket;

-- name: report_recoveries
-- Each lease expiry or explicit loss of the run's jobs, who held the job, and when and by
-- whom it was claimed again (NULL: not yet).
-- $1 job ids
SELECT e.job_id, e.kind, e.runner_id AS lost_by, e.lease_version, e.at,
       nxt.at AS claimed_again_at, nxt.runner_id AS claimed_by,
       extract(epoch FROM nxt.at - e.at)::float8 AS delay_s
FROM fleetq.events e
LEFT JOIN LATERAL (
    SELECT c.at, c.runner_id FROM fleetq.events c
    WHERE c.job_id = e.job_id AND c.kind = 'claimed' AND c.id > e.id
    ORDER BY c.id LIMIT 1
) nxt ON true
WHERE e.job_id = ANY ($1::bigint[]) AND e.kind IN ('lease_expired', 'lost')
ORDER BY e.id;

-- name: report_stops
-- Executions stopped before their end (cancelled, superseded, timeout, ...), and whether
-- the runner confirmed the process group gone.
-- $1 job ids
SELECT x.job_id, x.lease_version, x.runner_id, x.stop_reason, x.stop_confirmed, x.signal,
       x.ended_at
FROM fleetq.executions x
WHERE x.job_id = ANY ($1::bigint[]) AND x.stop_reason IS NOT NULL
ORDER BY x.job_id, x.lease_version;

-- name: report_stale
-- Zombie writes: fenced writes refused because the writer no longer held the lease (not
-- its races with its own outcome, counted apart below), by kind of write. $1 job ids
SELECT coalesce(detail ->> 'write', '') AS write, count(*) AS rejections
FROM fleetq.events
WHERE job_id = ANY ($1::bigint[]) AND kind = 'stale_rejected'
GROUP BY 1
ORDER BY 1;

-- name: report_self_races
-- Writes refused because they raced the writer's own committed outcome or hand-back:
-- benign, counted apart from zombie writes. $1 job ids
SELECT count(*) AS self_races
FROM fleetq.events
WHERE job_id = ANY ($1::bigint[]) AND kind = 'stale_self_race';

-- name: report_ledger
-- Writes of the run's jobs to the fenced ledger: how many, and how many it refused.
-- $1 job ids
SELECT count(*) AS writes, count(*) FILTER (WHERE NOT accepted) AS refused
FROM fleetq.fenced_writes
WHERE job_id = ANY ($1::bigint[]);

-- name: report_runners
-- Named runners as the database sees them: registered by which process, in what state.
-- $1 runner ids
SELECT id, pid, state, fleetq.runner_is_stale(last_heartbeat_at) AS stale
FROM fleetq.runners
WHERE id = ANY ($1::text[])
ORDER BY id;
