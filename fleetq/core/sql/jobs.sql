-- Submitting, cancelling and reading jobs.

-- name: jobs_submit
-- $1 project, $2 operation, $3 commit, $4 requested node, $5 idempotency key, $6 task id,
-- $7 submitted by, $8 payload (JSON text), $9 the jobs it waits for (NULL: none),
-- $10 W3C traceparent (NULL: none)
SELECT * FROM fleetq.submit($1::text, $2::text, $3::text, $4::text, $5::text, $6::text,
                            $7::text, $8::text::jsonb, $9::bigint[], $10::text);

-- name: jobs_rerun
-- An ended job's check again, as a new job (protocol/submit.sql, rerun).
-- $1 the job, $2 submitted by, $3 idempotency key (NULL: none)
SELECT * FROM fleetq.rerun($1::bigint, $2::text, $3::text);

-- name: jobs_submit_many
-- One statement for a batch (protocol/submit.sql, submit_many); answers in input order.
-- $1 projects, $2 operations, $3 commits, $4 requested nodes, $5 idempotency keys,
-- $6 task ids, $7 payloads (JSON texts), $8 traceparents, $9 submitted by
SELECT * FROM fleetq.submit_many($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                                 $6::text[], $7::text[]::jsonb[], $8::text[], $9::text);

-- name: jobs_cancel
-- $1 job, $2 actor, $3 reason
SELECT * FROM fleetq.cancel($1::bigint, $2::text, $3::text);

-- name: jobs_get
-- $1 job
SELECT j.*, fleetq.waiting_on(j.id, j.state) AS waiting_on
FROM fleetq.jobs j WHERE j.id = $1::bigint;

-- name: jobs_list
-- Newest first, each filter optional (NULL: any).
-- $1 state, $2 lane, $3 project, $4 runner (what it holds: its live leases and the
-- cancelled jobs it must still confirm stopped), $5 limit
SELECT *, fleetq.waiting_on(id, state) AS waiting_on
FROM fleetq.jobs
WHERE ($1::text IS NULL OR state = $1::text)
  AND ($2::text IS NULL OR lane = $2::text)
  AND ($3::text IS NULL OR project = $3::text)
  AND ($4::text IS NULL OR reserved_on = $4::text)
ORDER BY id DESC
LIMIT $5::integer;

-- name: jobs_for_commit
-- Every job that checked (project, commit), newest first, for the result reader.
-- $1 project, $2 commit, $3 operation (NULL: all)
SELECT j.id, j.operation, j.state, coalesce(j.failure_reason, j.cancel_reason) AS failure_reason,
       j.finished_at
FROM fleetq.jobs j
WHERE j.project = $1::text AND j.commit_sha = $2::text
  AND ($3::text IS NULL OR j.operation = $3::text)
ORDER BY j.id DESC;

-- name: jobs_known_operations
-- Whether a project is registered, and its operations (to refuse a question about an
-- unknown one rather than answer "not yet" for ever). $1 project
SELECT p.name AS project,
       ARRAY(SELECT o.name FROM fleetq.operations o WHERE o.project = p.name ORDER BY o.name)
           AS operations
FROM fleetq.projects p
WHERE p.name = $1::text;

-- name: jobs_results_for_commit
-- The newest verdict of each check of (project, commit) that decided something: a
-- cancelled job decides nothing, and never hides the verdict before it; with its
-- provenance whole. $1 project, $2 commit, $3 operation (NULL: all)
SELECT DISTINCT ON (operation)
       project, commit_sha, operation, job_id, verdict, exit_code, reason, log_tail,
       recorded_at, fleetq.provenance_whole(provenance) AS provenance
FROM fleetq.verdicts
WHERE project = $1::text AND commit_sha = $2::text
  AND ($3::text IS NULL OR operation = $3::text)
  AND verdict <> 'cancelled'
ORDER BY operation, job_id DESC;

-- name: jobs_verdict
-- One job's verdict, its provenance whole (`fleetq result --diff`). $1 job
SELECT project, commit_sha, operation, job_id, verdict, exit_code, reason, log_tail,
       recorded_at, fleetq.provenance_whole(provenance) AS provenance
FROM fleetq.verdicts
WHERE job_id = $1::bigint;

-- name: jobs_events
-- The history, oldest first after an id, optionally for one job or runner.
-- $1 after id, $2 job (NULL: any), $3 runner (NULL: any), $4 limit
SELECT *
FROM fleetq.events
WHERE id > $1::bigint
  AND ($2::bigint IS NULL OR job_id = $2::bigint)
  AND ($3::text IS NULL OR runner_id = $3::text)
ORDER BY id
LIMIT $4::integer;

-- name: jobs_latest_events
-- The newest events, for `fleetq events` without --after. $1 job, $2 runner, $3 limit
SELECT *
FROM (SELECT * FROM fleetq.events
      WHERE ($1::bigint IS NULL OR job_id = $1::bigint)
        AND ($2::text IS NULL OR runner_id = $2::text)
      ORDER BY id DESC
      LIMIT $3::integer) newest
ORDER BY id;
