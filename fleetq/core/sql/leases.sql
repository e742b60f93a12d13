-- The lease protocol (see fleetq/core/leasing.py). Each block calls one function of
-- migrations/0002_queue_protocol.sql; the casts make asyncpg and psycopg send the same
-- types, so function resolution never depends on the driver.

-- name: lease_claim
-- Take up to $3 eligible jobs of lane $2 for runner $1, as claim $4 (a client-made uuid:
-- a retry with the same id returns what the first attempt took).
SELECT * FROM fleetq.claim($1::text, $2::text, $3::integer, $4::uuid);

-- name: lease_heartbeat
-- Extend the leases of many jobs of one runner; answers ok/stale per job.
-- $1 runner, $2 job ids, $3 their lease versions
SELECT * FROM fleetq.heartbeat($1::text, $2::bigint[], $3::bigint[]);

-- name: lease_report_start
-- claimed -> running, with the execution's identity (node, run id, pid, start time).
-- $1 runner, $2 job, $3 version, $4 node, $5 run id, $6 pid, $7 process start, $8 prepare ms
SELECT fleetq.report_start($1::text, $2::bigint, $3::bigint, $4::text, $5::uuid, $6::integer,
                           $7::timestamptz, $8::integer) AS status;

-- name: lease_complete
-- Outcomes of many jobs of one runner in one round trip; answers ok/already/stale per job.
-- $1 runner, $2 jobs, $3 versions, $4 outcomes, $5 exit codes, $6 reasons, $7 log tails,
-- $8 prepare ms, $9 run ms, $10 ms since each process ended (NULL: not measured)
SELECT * FROM fleetq.complete($1::text, $2::bigint[], $3::bigint[], $4::text[], $5::integer[],
                              $6::text[], $7::text[], $8::integer[], $9::integer[],
                              $10::integer[]);

-- name: lease_report_lost
-- An explicit loss: requeued the first time, failed ('lost') the second.
-- $1 runner, $2 job, $3 version, $4 reason
SELECT fleetq.report_lost($1::text, $2::bigint, $3::bigint, $4::text) AS status;

-- name: lease_confirm_stop
-- The runner saw the execution's process group gone; ends "stop pending".
-- $1 runner, $2 job, $3 version, $4 signal, $5 reason (cancelled, superseded, ...),
-- $6 ms since the process group was seen gone (NULL: not measured, the end is bounded)
SELECT fleetq.confirm_stop($1::text, $2::bigint, $3::bigint, $4::integer, $5::text,
                           $6::integer) AS status;

-- name: lease_reap
-- Return expired leases to the queue (one leader at a time). $1 limit, $2 "now" override
-- (NULL: the database clock), for tests that move time without sleeping.
SELECT * FROM fleetq.reap($1::integer, $2::timestamptz);

-- name: lease_fenced_write
-- Write to the fenced ledger; false when a higher token was already seen for the key.
-- $1 key, $2 job, $3 token, $4 value (JSON text)
SELECT fleetq.fenced_write($1::text, $2::bigint, $3::bigint, $4::text::jsonb) AS accepted;

-- name: lease_fenced_violations
-- Accepted ledger writes whose token is below one accepted earlier for the same key.
-- Must always be 0; the fault tests assert it.
SELECT count(*) AS violations
FROM (
    SELECT token < max(token) OVER (PARTITION BY key ORDER BY id
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
           AS violation
    FROM fleetq.fenced_writes
    WHERE accepted
) w
WHERE w.violation;

-- name: lease_release
-- Hand a lease back on purpose (shutdown): requeued at once, not a loss, not a reassignment.
-- After a self-fence ($5 true) it counts a reassignment, and fails the job past the cap.
-- $1 runner, $2 job, $3 version, $4 reason, $5 fenced, $6 ms since its process ended
-- (NULL: nothing ran, or not measured)
SELECT fleetq.release($1::text, $2::bigint, $3::bigint, $4::text, $5::boolean,
                      $6::integer) AS status;

-- name: lease_job_states
-- The current state, owner and token of jobs a runner executes, so it can stop those
-- it no longer holds (cancelled, or claimed again by someone else). $1 job ids
SELECT id AS job_id, state, lease_owner, lease_version
FROM fleetq.jobs
WHERE id = ANY ($1::bigint[]);

-- name: lease_operations
-- What each registered operation runs, with its project's repository, for runners.
SELECT o.project, o.name AS operation, o.command, o.handler, o.timeout_s, p.repository
FROM fleetq.operations o
JOIN fleetq.projects p ON p.name = o.project;

-- name: lease_lock_for_handler
-- Inside a handler's own transaction: lock the job row under (owner, token), so what the
-- transaction writes commits only while the lease is held. $1 job, $2 runner, $3 version
SELECT 1 AS held FROM fleetq.jobs
WHERE id = $1::bigint AND lease_owner = $2::text AND lease_version = $3::bigint
  AND state IN ('claimed', 'running')
FOR UPDATE;

-- name: lease_held_by
-- What a runner holds in the database: its live leases and the cancelled jobs whose
-- stop it has not confirmed. The collection pass on start-up walks these. $1 runner
-- held_s: seconds since the claim, in database time.
SELECT id AS job_id, lease_version, state,
       extract(epoch FROM clock_timestamp() - claimed_at)::float8 AS held_s
FROM fleetq.jobs
WHERE reserved_on = $1::text
ORDER BY id;

-- name: lease_open_executions
-- A runner's executions with no recorded end, and whether their lease is still its own
-- (the collection pass closes those whose lease moved on while the runner was away; the
-- strays pass those nothing runs for, e.g. a handler claim whose reply was lost).
-- $1 runner
SELECT e.job_id, e.lease_version, e.run_id,
       (j.lease_owner IS NOT DISTINCT FROM e.runner_id AND j.lease_version = e.lease_version
        AND j.state IN ('claimed', 'running')) AS held
FROM fleetq.executions e
JOIN fleetq.jobs j ON j.id = e.job_id
WHERE e.runner_id = $1::text AND e.ended_at IS NULL
ORDER BY e.job_id, e.lease_version;

-- name: lease_note_event
-- A runner's own observation about a job it holds (e.g. adoption_refused), with evidence.
-- $1 kind, $2 job, $3 runner, $4 version, $5 detail (JSON text)
SELECT fleetq.log_events($1::text, ARRAY[$2::bigint], $3::text, ARRAY[$4::bigint], NULL,
                         $5::text::jsonb);
