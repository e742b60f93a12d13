-- The console's jobs view (fleetq/core/jobpages.py): a page under a filter, in an order,
-- its count and every id it matches. Each writes the filter out the same way: keep
-- them alike.

-- name: views_jobs
-- One page of jobs, newest first, each filter optional (NULL or false: any). `runner`
-- matches the lease owner or the runner a cancelled job is still reserved on; `word`
-- matches a job id, a commit prefix, an operation, a project or a submitter.
-- $1 state, $2 lane, $3 project, $4 runner, $5 reassigned only, $6 lost only, $7 word,
-- $8 limit
SELECT *, fleetq.waiting_on(id, state) AS waiting_on
FROM fleetq.jobs
WHERE ($1::text IS NULL OR state = $1::text)
  AND ($2::text IS NULL OR lane = $2::text)
  AND ($3::text IS NULL OR project = $3::text)
  AND ($4::text IS NULL OR lease_owner = $4::text OR reserved_on = $4::text)
  AND (NOT $5::boolean OR reassign_count > 0)
  AND (NOT $6::boolean OR lost_count > 0)
  AND ($7::text IS NULL OR id::text = $7::text OR starts_with(commit_sha, lower($7::text))
       OR operation = $7::text OR project = $7::text OR submitted_by = $7::text)
ORDER BY id DESC
LIMIT $8::integer;

-- name: views_jobs_count
-- How many jobs match the jobs view's filter, counted up to a cap (the exact figure of a
-- long history is not worth reading it all). $1..$7 as views_jobs, $8 cap
SELECT count(*) AS total
FROM (SELECT 1
      FROM fleetq.jobs
      WHERE ($1::text IS NULL OR state = $1::text)
        AND ($2::text IS NULL OR lane = $2::text)
        AND ($3::text IS NULL OR project = $3::text)
        AND ($4::text IS NULL OR lease_owner = $4::text OR reserved_on = $4::text)
        AND (NOT $5::boolean OR reassign_count > 0)
        AND (NOT $6::boolean OR lost_count > 0)
        AND ($7::text IS NULL OR id::text = $7::text
             OR starts_with(commit_sha, lower($7::text)) OR operation = $7::text
             OR project = $7::text OR submitted_by = $7::text)
      LIMIT $8::integer) capped;

-- name: views_jobs_sorted
-- One page of jobs in an order other than newest first (views_jobs reads that one by the
-- primary key's index): every match is sorted, which the operator asked for with `s`.
-- Each order's keys are NULL under the others, so one statement serves all four and its
-- plan, generic or not, is the same sort. Ties go newest first.
-- $1..$8 as views_jobs, $9 'oldest', 'state', 'lease' (least left first) or 'lost',
-- $10 the states in the order 'state' sorts them (jobpages.STATE_ORDER)
SELECT *, fleetq.waiting_on(id, state) AS waiting_on
FROM fleetq.jobs
WHERE ($1::text IS NULL OR state = $1::text)
  AND ($2::text IS NULL OR lane = $2::text)
  AND ($3::text IS NULL OR project = $3::text)
  AND ($4::text IS NULL OR lease_owner = $4::text OR reserved_on = $4::text)
  AND (NOT $5::boolean OR reassign_count > 0)
  AND (NOT $6::boolean OR lost_count > 0)
  AND ($7::text IS NULL OR id::text = $7::text OR starts_with(commit_sha, lower($7::text))
       OR operation = $7::text OR project = $7::text OR submitted_by = $7::text)
ORDER BY CASE WHEN $9::text = 'oldest' THEN created_at END,
         CASE WHEN $9::text = 'oldest' THEN id END,
         CASE WHEN $9::text = 'state' THEN array_position($10::text[], state) END,
         CASE WHEN $9::text = 'lease' AND state IN ('claimed', 'running')
              THEN lease_expires_at END,
         CASE WHEN $9::text = 'lost' THEN lost_count + reassign_count END DESC NULLS LAST,
         id DESC
LIMIT $8::integer;

-- name: views_job_ids
-- Every job id matching the jobs view's filter, newest first and with no page limit: what
-- "mark all that match" marks, however many. $1..$7 as views_jobs
SELECT id
FROM fleetq.jobs
WHERE ($1::text IS NULL OR state = $1::text)
  AND ($2::text IS NULL OR lane = $2::text)
  AND ($3::text IS NULL OR project = $3::text)
  AND ($4::text IS NULL OR lease_owner = $4::text OR reserved_on = $4::text)
  AND (NOT $5::boolean OR reassign_count > 0)
  AND (NOT $6::boolean OR lost_count > 0)
  AND ($7::text IS NULL OR id::text = $7::text OR starts_with(commit_sha, lower($7::text))
       OR operation = $7::text OR project = $7::text OR submitted_by = $7::text)
ORDER BY id DESC;
