-- The lease protocol (see fleetq/core/leasing.py). Each block calls one function of
-- migrations/0002_queue_protocol.sql; the casts make asyncpg and psycopg send the same
-- types, so function resolution never depends on the driver.

-- name: lease_announce_lane
-- Wake every runner of lane $1 (a job announced to this runner, which has no room for it).
SELECT pg_notify('fleetq_work', $1::text);

-- name: lease_claim
-- Take up to $3 eligible jobs of lane $2 for runner $1, as claim $4 (a client-made uuid:
-- a retry with the same id returns what the first attempt took). lease_left_s: how long
-- each lease has left on the database's clock, read after the claim set it (so never
-- more than it granted): the runner renews and fences each lease by its own length.
SELECT c.*, extract(epoch FROM c.lease_expires_at - clock_timestamp())::float8 AS lease_left_s
FROM fleetq.claim($1::text, $2::text, $3::integer, $4::uuid) c;

-- name: lease_heartbeat
-- Extend the leases of many jobs of one runner; answers ok/stale per job, and for a
-- renewed one how long it has left (lease_left_s, as in lease_claim).
-- $1 runner, $2 job ids, $3 their lease versions
SELECT h.*, extract(epoch FROM h.lease_expires_at - clock_timestamp())::float8 AS lease_left_s
FROM fleetq.heartbeat($1::text, $2::bigint[], $3::bigint[]) h;

-- name: lease_report_start
-- claimed -> running, with the execution's identity (node, run id, pid, start time).
-- $1 runner, $2 job, $3 version, $4 node, $5 run id, $6 pid, $7 process start, $8 prepare ms
SELECT fleetq.report_start($1::text, $2::bigint, $3::bigint, $4::text, $5::uuid, $6::integer,
                           $7::timestamptz, $8::integer) AS status;

-- name: lease_complete
-- Outcomes of many jobs of one runner in one round trip; answers ok/already/stale per job.
-- $1 runner, $2 jobs, $3 versions, $4 outcomes, $5 exit codes, $6 reasons, $7 log tails,
-- $8 prepare ms, $9 run ms, $10 ms since each process ended (NULL: not measured), $11
-- each verdict's provenance as JSON text (NULL: none; fleetq.provenance_kept)
SELECT * FROM fleetq.complete($1::text, $2::bigint[], $3::bigint[], $4::text[], $5::integer[],
                              $6::text[], $7::text[], $8::integer[], $9::integer[],
                              $10::integer[], $11::text[]::jsonb[]);

-- name: lease_complete_and_claim
-- lease_complete's outcomes ($14 their provenance), then a claim of up to $12 jobs of lane
-- $11 as claim $13, in one
-- transaction: kind 'outcome' rows (job_id, status), then kind 'claim' rows (with
-- lease_left_s, as in lease_claim).
SELECT r.*, extract(epoch FROM r.lease_expires_at - clock_timestamp())::float8 AS lease_left_s
FROM fleetq.complete_and_claim($1::text, $2::bigint[], $3::bigint[], $4::text[],
                               $5::integer[], $6::text[], $7::text[], $8::integer[],
                               $9::integer[], $10::integer[], $11::text, $12::integer,
                               $13::uuid, $14::text[]::jsonb[]) r;

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

-- name: lease_fenced_duplicates
-- Jobs whose ledger effects were accepted under more than one token: a superseded run's
-- write that landed before its successor's (fencing refuses a stale write only once a
-- newer token has written). Not a violation; the figure says how often it happened.
SELECT count(*) AS duplicates
FROM (SELECT job_id FROM fleetq.fenced_writes WHERE accepted
      GROUP BY job_id HAVING count(DISTINCT token) > 1) d;

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
-- it no longer holds (cancelled, or claimed again by someone else); only jobs this
-- runner claimed are answered. $1 runner, $2 job ids
SELECT * FROM fleetq.runner_job_states($1::text, $2::bigint[]);

-- name: lease_job
-- A job this runner holds, in full (to adopt a run launched before a restart), with how
-- long its lease has left (lease_left_s, as in lease_claim). $1 runner, $2 job
SELECT j.*, extract(epoch FROM j.lease_expires_at - clock_timestamp())::float8 AS lease_left_s
FROM fleetq.runner_job($1::text, $2::bigint) j;

-- name: lease_operations
-- What each registered operation runs, with its project's repository, for runners.
SELECT * FROM fleetq.runner_operations();

-- name: lease_lock_for_handler
-- Inside a handler's own transaction: lock the job row under (owner, token), so what the
-- transaction writes commits only while the lease is held (NULL: not held).
-- $1 job, $2 runner, $3 version
SELECT fleetq.lock_for_handler($1::bigint, $2::text, $3::bigint) AS held;

-- name: lease_held_by
-- What a runner holds in the database: its live leases and the cancelled jobs whose
-- stop it has not confirmed. The collection pass on start-up walks these. $1 runner
-- held_s: seconds since the claim, in database time.
SELECT * FROM fleetq.runner_held($1::text);

-- name: lease_open_executions
-- A runner's executions with no recorded end, and whether their lease is still its own
-- (the collection pass closes those whose lease moved on while the runner was away; the
-- strays pass those nothing runs for, e.g. a handler claim whose reply was lost).
-- $1 runner
SELECT * FROM fleetq.runner_open_executions($1::text);

-- name: lease_note_event
-- A runner's own observation about a job it holds (e.g. adoption_refused), with evidence.
-- $1 kind, $2 job, $3 runner, $4 version, $5 detail (JSON text)
SELECT fleetq.runner_note($1::text, $2::bigint, $3::text, $4::bigint, $5::text::jsonb);

-- name: lease_next_retry_in
-- Seconds until the next retry falls due; NULL when none waits.
SELECT fleetq.next_retry_in() AS seconds;
