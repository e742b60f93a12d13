-- The floor (bench/fleetq_bench/peers/floor.py): the least a durable PostgreSQL queue does for
-- a job, one statement per step: an INSERT and a NOTIFY to enqueue, an UPDATE ... FOR
-- UPDATE SKIP LOCKED to claim, an UPDATE to record the end. No identity, no event, no
-- eligibility, no lease, no reservation: what any queue on this server pays at least.

-- name: floor_install
CREATE TABLE floor_jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    state text NOT NULL DEFAULT 'queued',
    payload jsonb,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    picked_at timestamptz,
    done_at timestamptz,
    picks integer NOT NULL DEFAULT 0  -- claims of the job: a job claimed twice is no success
);
CREATE INDEX floor_jobs_queued ON floor_jobs (id) WHERE state = 'queued';

-- name: floor_enqueue
-- $1 jobs: no-op jobs (no payload) in one INSERT, and a NOTIFY to each of the $2 workers
-- (each LISTENs on a channel of its own); answers the first id.
WITH made AS (
    INSERT INTO floor_jobs (payload) SELECT NULL FROM generate_series(1, $1::integer)
    RETURNING id
)
SELECT (SELECT min(id) FROM made) AS first,
       (SELECT count(pg_notify('floor_' || w, '')) FROM generate_series(0, $2::integer - 1) w)
           AS notified;

-- name: floor_submit
-- $1 payload (JSON text): one job, and a NOTIFY to one of the $2 workers (by the job's
-- id), so one claims it where a shared channel would wake them all.
WITH made AS (INSERT INTO floor_jobs (payload) VALUES ($1::text::jsonb) RETURNING id)
SELECT id, pg_notify('floor_' || id % $2::integer, '') FROM made;

-- name: floor_claim
-- $1 limit: the oldest queued jobs, taken.
UPDATE floor_jobs j SET state = 'picked', picked_at = clock_timestamp(), picks = j.picks + 1
FROM (SELECT id FROM floor_jobs WHERE state = 'queued' ORDER BY id LIMIT $1::integer
      FOR UPDATE SKIP LOCKED) c
WHERE j.id = c.id
RETURNING j.id, j.payload::text AS payload;

-- name: floor_done
-- $1 job ids: their ends, in one statement.
UPDATE floor_jobs SET state = 'done', done_at = clock_timestamp() WHERE id = ANY ($1::bigint[]);

-- name: floor_open
-- 1 while any job is queued or picked.
SELECT EXISTS (SELECT 1 FROM floor_jobs WHERE state <> 'done')::integer AS open;

-- name: floor_span
-- First pick to last end, database time; a job succeeded when it ended, claimed once. $1 first job id, $2 the first id after the phase's
SELECT count(*) AS jobs, count(*) FILTER (WHERE state = 'done' AND picks = 1) AS succeeded,
       extract(epoch FROM max(done_at) - min(picked_at))::float8 AS seconds
FROM floor_jobs WHERE id >= $1::bigint AND id < $2::bigint;
