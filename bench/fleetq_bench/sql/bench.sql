-- `fleetq-bench`: enqueue fast, then read the figures back from database time.

-- name: bench_enqueue
-- $1 jobs, in one bulk submit (fleetq.submit_many: the same checks, events and wake-ups
-- as any submit, one statement); answers the first job's id, so the harness needs no
-- second statement to find where its jobs begin.
SELECT count(*) AS n, min(job_id) AS first
FROM fleetq.submit_many(array_fill('bench'::text, ARRAY[$1::integer]),
                        array_fill('noop'::text, ARRAY[$1::integer]),
                        array_fill(repeat('0', 40), ARRAY[$1::integer]),
                        array_fill(NULL::text, ARRAY[$1::integer]),
                        array_fill(NULL::text, ARRAY[$1::integer]),
                        array_fill(NULL::text, ARRAY[$1::integer]),
                        array_fill('{}'::jsonb, ARRAY[$1::integer]),
                        array_fill(NULL::text, ARRAY[$1::integer]), 'bench');

-- name: bench_progress
-- 1 while any job is still queued or live, else 0: two probes of partial indexes, so
-- polling it does not steal the CPU being measured.
SELECT (EXISTS (SELECT 1 FROM fleetq.jobs WHERE state = 'queued')
        OR EXISTS (SELECT 1 FROM fleetq.jobs WHERE state IN ('claimed', 'running')))::integer
       AS open;

-- name: bench_throughput
-- From the first claim to the last outcome, in database time.
-- $1 first job id, $2 the first id after the phase's
SELECT count(*) AS jobs,
       extract(epoch FROM max(finished_at) - min(claimed_at))::float8 AS seconds,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded
FROM fleetq.jobs WHERE id >= $1::bigint AND id < $2::bigint;

-- name: bench_latency
-- Created -> claimed in database time (for an in-process handler, the claim is the
-- start), in ms, one value per job: what the database can see of enqueue -> start.
-- (Percentiles are taken by fleetq_bench.stats, as for every system compared.)
-- $1 first job id
SELECT coalesce(array_agg(extract(epoch FROM claimed_at - created_at)::float8 * 1000),
                '{}') AS ms
FROM fleetq.jobs WHERE id >= $1::bigint AND claimed_at IS NOT NULL;

-- name: bench_submit_one
-- One latency job; its payload holds the producer's clock just before this call.
-- $1 payload (JSON text)
SELECT job_id FROM fleetq.submit('bench', 'stamp', repeat('0', 40), NULL, NULL, NULL, 'bench',
                            $1::text::jsonb);

-- name: bench_producer_latency
-- Enqueue -> start on the producer's clock, in ms, one value per job: from the clock
-- just before each latency job's submit (its payload) to the handler's at its first
-- line (its log tail). $1 first job id
SELECT coalesce(array_agg((v.log_tail::float8 - (j.payload->>'t0')::float8) * 1000), '{}')
       AS ms
FROM fleetq.jobs j JOIN fleetq.verdicts v ON v.job_id = j.id
WHERE j.id >= $1::bigint AND j.operation = 'stamp' AND v.verdict = 'passed';

-- name: bench_registered
-- Runners that registered and are active.
SELECT count(*) AS n FROM fleetq.runners WHERE state = 'active';

-- name: bench_last_id
-- The newest job's id (the scale benchmark's bursts start after it).
SELECT coalesce(max(id), 0) AS id FROM fleetq.jobs;

-- name: bench_transactions
-- Transactions committed or rolled back on this database so far (cumulative statistics,
-- flushed by each backend about once a second).
SELECT xact_commit + xact_rollback AS n FROM pg_stat_database WHERE datname = current_database();
