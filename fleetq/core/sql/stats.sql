-- Overlap windows and fleet statistics, read from executions and events.

-- name: stats_overlaps
-- Intervals where two executions of one job (different tokens) were alive at once
-- (a running handler's execution included, which is no row until its lease ends:
-- fleetq.all_executions).
-- An execution lives from its launch (the runner's report of the process start) until
-- its end was recorded; an open end means it may still run. The window's end is
-- "confirmed" when the execution that ends it has a recorded end: an outcome, or a stop
-- the runner confirmed (process group gone); "measured" when both ends are: the one
-- recorded first was dated from the runner's own clock of the exit, and the other is
-- measured too, or is the newer run, still open under its live lease. An older run
-- with no end recorded is not known to have run on at all: its runner was killed,
-- frozen or cut off (a kill -9 in the demo showed an 8.1 s "measured" window). A bounded end (a killed runner's run closed by its successor's
-- collection, say) is only an upper bound: it may really lie before the other end, or
-- before the other run's launch, and then there was a shorter overlap or none at all.
-- Otherwise the window's length is only an upper bound.
-- $1 only windows still open, $2 one job (NULL: every job), $3 one project (NULL: all)
SELECT a.job_id,
       a.lease_version AS older_token, b.lease_version AS newer_token,
       a.runner_id AS older_runner, b.runner_id AS newer_runner,
       greatest(a.launched_at, b.launched_at) AS started_at,
       CASE WHEN a.ended_at IS NULL OR b.ended_at IS NULL
            THEN coalesce(a.ended_at, b.ended_at)
            ELSE least(a.ended_at, b.ended_at) END AS ended_at,
       (a.ended_at IS NULL AND b.ended_at IS NULL) AS open,
       CASE WHEN a.ended_at IS NULL AND b.ended_at IS NULL THEN false
            WHEN b.ended_at IS NULL OR a.ended_at <= b.ended_at
                 THEN a.stop_confirmed OR a.exit_code IS NOT NULL
            ELSE b.stop_confirmed OR b.exit_code IS NOT NULL END AS end_confirmed,
       CASE WHEN a.ended_at IS NULL AND b.ended_at IS NULL THEN false
            WHEN b.ended_at IS NULL OR a.ended_at <= b.ended_at
                 THEN a.end_measured AND (b.ended_at IS NULL OR b.end_measured)
            ELSE b.end_measured AND a.end_measured END AS end_measured,
       a.stop_reason AS older_stop_reason, a.ended_at IS NULL AS older_open
FROM fleetq.all_executions a
JOIN fleetq.all_executions b
  ON b.job_id = a.job_id AND b.lease_version > a.lease_version
WHERE a.launched_at IS NOT NULL AND b.launched_at IS NOT NULL
  AND b.launched_at < coalesce(a.ended_at, 'infinity')
  AND a.launched_at < coalesce(b.ended_at, 'infinity')
  AND (NOT $1::boolean OR (a.ended_at IS NULL AND b.ended_at IS NULL))
  AND ($2::bigint IS NULL OR a.job_id = $2::bigint)
  AND ($3::text IS NULL
       OR EXISTS (SELECT 1 FROM fleetq.jobs j WHERE j.id = a.job_id AND j.project = $3::text))
ORDER BY started_at;

-- name: stats_queue_wait
-- Queue wait (created -> claimed) by project and priority class, in seconds.
-- $1 one project (NULL: all)
SELECT project, priority_class, count(*) AS jobs,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM claimed_at - created_at))
           AS p50_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM claimed_at - created_at))
           AS p95_s,
       max(extract(epoch FROM claimed_at - created_at)) AS max_s
FROM fleetq.jobs
WHERE claimed_at IS NOT NULL AND ($1::text IS NULL OR project = $1::text)
GROUP BY project, priority_class
ORDER BY priority_class, project;

-- name: stats_recovery
-- Recovery delay: from a lease expiry or an explicit loss to the job's next claim.
-- $1 one project (NULL: all)
SELECT count(*) AS incidents,
       count(nxt.at) AS recovered,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM nxt.at - e.at)) AS p50_s,
       max(extract(epoch FROM nxt.at - e.at)) AS max_s
FROM fleetq.events e
LEFT JOIN LATERAL (
    SELECT c.at FROM fleetq.events c
    WHERE c.job_id = e.job_id AND c.kind = 'claimed' AND c.id > e.id
    ORDER BY c.id LIMIT 1
) nxt ON true
WHERE e.kind IN ('lease_expired', 'lost')
  AND ($1::text IS NULL
       OR EXISTS (SELECT 1 FROM fleetq.jobs j WHERE j.id = e.job_id AND j.project = $1::text));

-- name: stats_states
-- Jobs by state. $1 one project (NULL: all)
SELECT state, count(*) AS jobs FROM fleetq.jobs
WHERE $1::text IS NULL OR project = $1::text
GROUP BY state ORDER BY state;

-- name: stats_stale
-- Zombie writes refused as stale, and races with a runner's own outcome, fleet-wide
-- (the runners' counters) or for one project's jobs (their events). $1 project (NULL: all)
SELECT coalesce(sum(stale_rejections), 0) AS stale_rejections,
       coalesce(sum(self_races), 0) AS self_races
FROM fleetq.runners
HAVING $1::text IS NULL
UNION ALL
SELECT count(*) FILTER (WHERE e.kind = 'stale_rejected'),
       count(*) FILTER (WHERE e.kind = 'stale_self_race')
FROM fleetq.events e
JOIN fleetq.jobs j ON j.id = e.job_id
WHERE j.project = $1::text AND e.kind IN ('stale_rejected', 'stale_self_race')
HAVING $1::text IS NOT NULL;

-- name: stats_flaky
-- Flaky tests (issue 47): a test named failing in a verdict, with a later verdict of the
-- same check (project, commit, operation) that passed with its test reports read. Per
-- test: the commits where it flipped, and the newest flip. The verdicts with failing
-- tests are few; each looks up its check's later verdicts by verdicts_by_check.
-- $1 project (NULL: all), $2 at most this many
SELECT f.project, f.operation, f.test, count(DISTINCT f.commit_sha) AS commits,
       max(p.recorded_at) AS last_passed_at
FROM (SELECT v.project, v.commit_sha, v.operation, v.job_id, e #>> '{}' AS test
      FROM fleetq.verdicts v
      -- as written by a runner: only a list's strings are test names
      CROSS JOIN LATERAL jsonb_array_elements(
          CASE WHEN jsonb_typeof(v.provenance -> 'tests' -> 'failing') = 'array'
               THEN v.provenance -> 'tests' -> 'failing' ELSE '[]' END) e
      WHERE jsonb_typeof(e) = 'string'
        AND ($1::text IS NULL OR v.project = $1::text)) f
JOIN fleetq.verdicts p
  ON p.project = f.project AND p.commit_sha = f.commit_sha AND p.operation = f.operation
 AND p.job_id > f.job_id AND p.verdict = 'passed'
 -- as written by a runner: a count of another shape is no count (never a failed cast)
 AND CASE WHEN jsonb_typeof(p.provenance -> 'tests' -> 'reports') = 'number'
          THEN (p.provenance -> 'tests' ->> 'reports')::numeric > 0 ELSE false END
GROUP BY f.project, f.operation, f.test
ORDER BY commits DESC, last_passed_at DESC, f.test
LIMIT $2::integer;
