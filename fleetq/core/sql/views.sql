-- What the operator's console reads. Every query is bounded (a page, a time window, or
-- one row per lane/shape/runner) so the console stays quick with 10,000 jobs queued.
-- "Now" is the database's clock, passed in ($1) so a test can pin it.

-- name: views_now
-- The database's clock: ages and lease countdowns are computed from it, not the laptop's.
SELECT clock_timestamp() AS now;

-- name: views_lanes
-- Per lane: live depth by state, slots of online runners, eligible runners, oldest wait.
-- A runner counts as eligible for a lane when it serves it and could claim now (active
-- and heartbeating); capacity is shown apart, as slots in use.
SELECT l.name AS lane,
       coalesce(j.queued, 0) AS queued,
       coalesce(j.claimed, 0) AS claimed,
       coalesce(j.running, 0) AS running,
       coalesce(j.stop_pending, 0) AS stop_pending,
       coalesce(s.slots, 0) AS slots,
       coalesce(s.slots_used, 0) AS slots_used,
       coalesce(s.runners, 0) AS runners,
       coalesce(s.eligible_runners, 0) AS eligible_runners,
       j.oldest_queued_at
FROM fleetq.lanes l
LEFT JOIN (
    SELECT lane,
           count(*) FILTER (WHERE state = 'queued') AS queued,
           count(*) FILTER (WHERE state = 'claimed') AS claimed,
           count(*) FILTER (WHERE state = 'running') AS running,
           count(*) FILTER (WHERE state = 'cancelled') AS stop_pending,
           min(created_at) FILTER (WHERE state = 'queued') AS oldest_queued_at
    FROM fleetq.jobs
    WHERE state IN ('queued', 'claimed', 'running')
       OR (state = 'cancelled' AND reserved_on IS NOT NULL)
    GROUP BY lane
) j ON j.lane = l.name
LEFT JOIN (
    SELECT rl.lane,
           sum(rl.slots) FILTER (WHERE NOT stale.offline) AS slots,
           sum(rl.slots_used) AS slots_used,
           count(*) AS runners,
           count(*) FILTER (WHERE r.state = 'active' AND NOT stale.offline) AS eligible_runners
    FROM fleetq.runner_lanes rl
    JOIN fleetq.runners r ON r.id = rl.runner_id
    CROSS JOIN LATERAL (SELECT r.state = 'offline'
                               OR fleetq.runner_is_stale(r.last_heartbeat_at) AS offline) stale
    GROUP BY rl.lane
) s ON s.lane = l.name
ORDER BY l.name;

-- name: views_queue_wait
-- Queue wait (created -> claimed) by priority class, over jobs claimed in the window.
-- $1 now, $2 window in seconds
SELECT priority_class, count(*) AS jobs,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM claimed_at - created_at))
           AS p50_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM claimed_at - created_at))
           AS p95_s
FROM fleetq.jobs
WHERE claimed_at > $1::timestamptz - make_interval(secs => $2::integer)
GROUP BY priority_class
ORDER BY priority_class;

-- name: views_throughput
-- Jobs finished per bucket, oldest bucket first, ending at now (empty buckets are 0).
-- $1 now, $2 bucket seconds, $3 buckets
SELECT b.i AS bucket, count(j.ago) AS finished
FROM generate_series(0, $3::integer - 1) AS b(i)
LEFT JOIN (
    SELECT floor(extract(epoch FROM $1::timestamptz - finished_at) / $2::integer)::integer AS ago
    FROM fleetq.jobs
    WHERE finished_at > $1::timestamptz - make_interval(secs => $2::integer * $3::integer)
      AND finished_at <= $1::timestamptz
) j ON j.ago = $3::integer - 1 - b.i
GROUP BY b.i
ORDER BY b.i;

-- name: views_alerts
-- What needs an operator's eye: cancelled jobs whose stop the runner has not confirmed,
-- stops the runner could not confirm (it drained itself), and queued jobs that no
-- registered runner could take even when idle (the claim's own rule, evaluated with the
-- runner's whole capacity free; evaluated once per distinct job shape, not per job).
WITH shapes AS (
    SELECT lane, capabilities, requested_node, memory_mb, cpu_millis, count(*) AS jobs
    FROM fleetq.jobs
    WHERE state = 'queued'
    GROUP BY lane, capabilities, requested_node, memory_mb, cpu_millis
),
unplaceable AS (
    SELECT s.jobs
    FROM shapes s
    WHERE NOT EXISTS (
        SELECT 1
        FROM fleetq.runners r
        JOIN fleetq.runner_lanes l ON l.runner_id = r.id AND l.lane = s.lane
        WHERE r.state <> 'offline'
          AND fleetq.ineligibility(s.capabilities, s.requested_node, s.memory_mb, s.cpu_millis,
                                   r.node, r.capabilities, 'active', false,
                                   r.memory_mb, r.cpu_millis, l.slots, 0) IS NULL)
)
SELECT (SELECT count(*) FROM fleetq.jobs
        WHERE state = 'cancelled' AND reserved_on IS NOT NULL) AS stops_pending,
       (SELECT count(*) FROM fleetq.runners
        WHERE state_reason LIKE 'stop-unconfirmed%') AS stops_unconfirmed,
       (SELECT coalesce(sum(jobs), 0) FROM unplaceable) AS unplaceable;

-- name: views_jobs
-- One page of jobs, newest first, each filter optional (NULL: any). `runner` matches the
-- lease owner or the runner a cancelled job is still reserved on.
-- $1 state, $2 lane, $3 project, $4 runner, $5 limit
SELECT *, count(*) OVER () AS total
FROM fleetq.jobs
WHERE ($1::text IS NULL OR state = $1::text)
  AND ($2::text IS NULL OR lane = $2::text)
  AND ($3::text IS NULL OR project = $3::text)
  AND ($4::text IS NULL OR lease_owner = $4::text OR reserved_on = $4::text)
ORDER BY id DESC
LIMIT $5::integer;

-- name: views_executions
-- Every execution of a job, by fencing token, with its claim time from the events.
-- $1 job
SELECT x.*,
       (SELECT min(e.at) FROM fleetq.events e
        WHERE e.job_id = x.job_id AND e.kind = 'claimed'
          AND e.lease_version = x.lease_version) AS claimed_at
FROM fleetq.executions x
WHERE x.job_id = $1::bigint
ORDER BY x.lease_version;

-- name: views_job_output
-- The recorded output tail of a job, when its verdict is still the latest for its
-- (project, commit, operation). $1 job
SELECT exit_code, reason, log_tail FROM fleetq.results WHERE job_id = $1::bigint;
