-- pgqueuer 1.6's tables, as `Queries.install` makes them (durable: all logged).

-- name: pgqueuer_open
-- 1 while any job is still in the queue table: pgqueuer deletes a job as it logs its
-- outcome, in one statement, so an empty table is a drained queue.
SELECT EXISTS (SELECT 1 FROM pgqueuer)::integer AS open;

-- name: pgqueuer_span
-- First pick to last outcome in database time: the log gets a row per pick and per
-- outcome, each stamped now() by the transaction that wrote it.
-- $1 first job id, $2 the first id after the phase's
SELECT count(*) FILTER (WHERE status = 'picked') AS jobs,
       count(*) FILTER (WHERE status = 'successful') AS succeeded,
       extract(epoch FROM max(created) FILTER (WHERE status = 'successful')
                        - min(created) FILTER (WHERE status = 'picked'))::float8 AS seconds
FROM pgqueuer_log WHERE job_id >= $1::bigint AND job_id < $2::bigint;
