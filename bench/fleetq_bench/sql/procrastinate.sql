-- procrastinate 3.10's tables, as its schema manager makes them.

-- name: procrastinate_open
-- 1 while any job is waiting or running (jobs stay, as succeeded, when done).
SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))::integer
       AS open;

-- name: procrastinate_span
-- First start to last outcome in database time, from the events its triggers write
-- (each stamped now() by the transaction that moved the job).
-- $1 first job id, $2 the first id after the phase's
SELECT count(*) FILTER (WHERE type = 'started') AS jobs,
       count(*) FILTER (WHERE type = 'succeeded') AS succeeded,
       extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')
                        - min(at) FILTER (WHERE type = 'started'))::float8 AS seconds
FROM procrastinate_events WHERE job_id >= $1::bigint AND job_id < $2::bigint;

-- name: procrastinate_workers
-- Workers registered (each registers once its loop starts).
SELECT count(*) AS n FROM procrastinate_workers;
