-- `fleetq bench`: enqueue fast, then read the figures back from database time.

-- name: bench_enqueue
-- $1 jobs, through fleetq.submit (same checks, events and NOTIFYs as any submit)
SELECT count(*) AS n
FROM generate_series(1, $1::integer) i,
     -- nullif(i, i) is NULL, but depends on i, so submit runs once per row
     LATERAL fleetq.submit('bench', 'noop', repeat('0', 40), nullif(i, i)::text, NULL, NULL,
                           'bench', '{}') s;

-- name: bench_progress
-- 1 while any job is still queued or live, else 0: two probes of partial indexes, so
-- polling it does not steal the CPU being measured.
SELECT (EXISTS (SELECT 1 FROM fleetq.jobs WHERE state = 'queued')
        OR EXISTS (SELECT 1 FROM fleetq.jobs WHERE state IN ('claimed', 'running')))::integer
       AS open;

-- name: bench_throughput
-- From the first claim to the last outcome, in database time. $1 first job id
SELECT count(*) AS jobs,
       extract(epoch FROM max(finished_at) - min(claimed_at)) AS seconds,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded
FROM fleetq.jobs WHERE id >= $1::bigint;

-- name: bench_latency
-- Enqueue -> start (for an in-process handler, the claim is the start), in ms.
-- $1 first job id
SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP
           (ORDER BY extract(epoch FROM claimed_at - created_at) * 1000) AS ms,
       count(*) AS jobs
FROM fleetq.jobs WHERE id >= $1::bigint AND claimed_at IS NOT NULL;

-- name: bench_last_id
SELECT coalesce(max(id), 0) AS id FROM fleetq.jobs;

-- name: bench_submit_one
SELECT * FROM fleetq.submit('bench', 'noop', repeat('0', 40), NULL, NULL, NULL, 'bench', '{}');

-- name: bench_registered
-- Runners that registered and are active.
SELECT count(*) AS n FROM fleetq.runners WHERE state = 'active';
