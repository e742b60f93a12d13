-- Waiting for jobs to end (fleetq/core/waiting.py; protocol/watching.sql).

-- name: watch_jobs
-- Watch these jobs (none: stop watching); their states now.
-- $1 job ids
SELECT job_id, state FROM fleetq.watch_jobs($1::bigint[]);

-- name: watch_states
-- The watched jobs' states, read again when a notification says one ended.
-- $1 job ids
SELECT id, state FROM fleetq.jobs WHERE id = ANY ($1::bigint[]);

-- name: watch_verdicts
-- Each job with its verdict, if it has one (every ending records one), a cancel's reason
-- too. $1 job ids
SELECT j.id AS job_id, v.verdict, v.exit_code, coalesce(v.reason, j.cancel_reason) AS reason,
       j.operation, v.recorded_at, coalesce(v.log_tail, '') AS log_tail
FROM fleetq.jobs j
LEFT JOIN fleetq.verdicts v ON v.job_id = j.id
WHERE j.id = ANY ($1::bigint[]);