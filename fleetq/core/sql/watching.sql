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
-- The verdicts of ended jobs (every ending records one), a cancel's reason too.
-- $1 job ids
SELECT v.job_id, v.verdict, v.exit_code, coalesce(v.reason, j.cancel_reason) AS reason
FROM fleetq.verdicts v
JOIN fleetq.jobs j ON j.id = v.job_id
WHERE v.job_id = ANY ($1::bigint[]);
