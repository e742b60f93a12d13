-- 0034_job_watchers: `fleetq wait` and `result --wait` block on a notification when a job
-- they wait on ends, not on polling (issue 42, finding 7).
--
-- fleetq: expand
--
-- An ending sends no NOTIFY of its own: PostgreSQL commits notifying transactions one at
-- a time, and a NOTIFY from every outcome serialized the queue. So a waiter says what it
-- waits on (fleetq.watch_jobs, protocol/watching.sql), a row per (job, waiting session), and
-- an ending notifies `fleetq_done` only for jobs that have one: nobody waiting, nothing
-- sent, and the hot path pays one probe of this (usually empty) table. A session's rows
-- go when it waits on something else or on nothing, and with it when it ends (the next
-- watch_jobs removes the rows of sessions that are gone). No foreign key: a row names a
-- job only as long as someone waits, and prune must never wait on it.

CREATE TABLE fleetq.job_watchers (
    job_id  bigint NOT NULL,
    pid     integer NOT NULL,  -- the waiting session's backend
    since   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, pid)
);

INSERT INTO fleetq.grants (privilege, object, grantee)
SELECT 'EXECUTE', 'FUNCTION fleetq.watch_jobs(bigint[])', g
FROM unnest(ARRAY['fleetq_reader', 'fleetq_submitter', 'fleetq_operator']) g;
