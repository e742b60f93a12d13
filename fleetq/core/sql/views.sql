-- What the operator's console reads. Every query is bounded (a page, a time window, or
-- one row per lane/shape/runner) so the console stays quick with 10,000 jobs queued.
-- "Now" is the database's clock, passed in ($1) so a test can pin it.

-- name: views_newest_event
-- The newest event's id: the console polls it to learn that something happened (events
-- send no NOTIFY; see fleetq.log_events).
SELECT coalesce(max(id), 0) AS id FROM fleetq.events;

-- name: views_now
-- The database's clock: ages and lease countdowns are computed from it, not the laptop's.
SELECT clock_timestamp() AS now;

-- name: views_lanes
-- Per lane: live depth by state, slots of online runners and how many are in use (a
-- cancelled job holds its slot until its stop is confirmed), eligible runners, oldest
-- wait. Each depth is read through the partial index that covers its state, so the cost
-- follows live work, not history. A runner counts as eligible for a lane when it serves
-- it and could claim now (active and heartbeating).
WITH depth AS (
    SELECT lane, 'queued' AS state, count(*) AS jobs, min(created_at) AS oldest
    FROM fleetq.jobs WHERE state = 'queued' GROUP BY lane
    UNION ALL
    SELECT lane, state, count(*), NULL
    FROM fleetq.jobs WHERE state IN ('claimed', 'running') GROUP BY lane, state
    UNION ALL
    SELECT lane, 'stop_pending', count(*), NULL
    FROM fleetq.jobs WHERE reserved_on IS NOT NULL AND state = 'cancelled' GROUP BY lane
),
capacity AS (
    SELECT rl.lane,
           sum(rl.slots) FILTER (WHERE NOT stale.offline) AS slots,
           sum(rl.slots_used) FILTER (WHERE NOT stale.offline) AS slots_used,
           count(*) AS runners,
           count(*) FILTER (WHERE r.state = 'active' AND NOT stale.offline) AS eligible_runners
    FROM fleetq.runner_lanes rl
    JOIN fleetq.runners r ON r.id = rl.runner_id
                           AND fleetq.runner_listed(r.forgotten_at, r.last_heartbeat_at)
    CROSS JOIN LATERAL (SELECT r.state = 'offline'
                               OR fleetq.runner_is_stale(r.last_heartbeat_at) AS offline) stale
    GROUP BY rl.lane
)
SELECT l.name AS lane,
       coalesce(sum(d.jobs) FILTER (WHERE d.state = 'queued'), 0) AS queued,
       coalesce(sum(d.jobs) FILTER (WHERE d.state = 'claimed'), 0) AS claimed,
       coalesce(sum(d.jobs) FILTER (WHERE d.state = 'running'), 0) AS running,
       coalesce(sum(d.jobs) FILTER (WHERE d.state = 'stop_pending'), 0) AS stop_pending,
       coalesce(min(c.slots), 0) AS slots,
       coalesce(min(c.slots_used), 0) AS slots_used,
       coalesce(min(c.runners), 0) AS runners,
       coalesce(min(c.eligible_runners), 0) AS eligible_runners,
       min(d.oldest) AS oldest_queued_at
FROM fleetq.lanes l
LEFT JOIN depth d ON d.lane = l.name
LEFT JOIN capacity c ON c.lane = l.name
GROUP BY l.name
ORDER BY l.name;

-- name: views_queue_wait
-- Queue wait (created -> claimed) by priority class, over claims in the window. Read from
-- the claim events: the window's first event id is found by walking the events' primary
-- key back from the newest, so the cost follows recent activity, not history, and the
-- claim path pays for no extra index.
-- $1 now, $2 window in seconds
WITH since AS (
    SELECT coalesce(max(id), 0) AS id
    FROM fleetq.events
    WHERE at <= $1::timestamptz - make_interval(secs => $2::integer)
)
SELECT j.priority_class, count(*) AS jobs,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM e.at - j.created_at))
           AS p50_s,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM e.at - j.created_at))
           AS p95_s
FROM since
JOIN fleetq.events e ON e.id > since.id
JOIN fleetq.jobs j ON j.id = e.job_id
WHERE e.kind = 'claimed' AND e.at <= $1::timestamptz
GROUP BY j.priority_class
ORDER BY j.priority_class;

-- name: views_throughput
-- Jobs that reached an end per bucket, oldest bucket first, ending at now (empty buckets
-- are 0), from the outcome and cancel events of the window (found as in
-- views_queue_wait). $1 now, $2 bucket seconds, $3 buckets
WITH since AS (
    SELECT coalesce(max(id), 0) AS id
    FROM fleetq.events
    WHERE at <= $1::timestamptz - make_interval(secs => $2::integer * $3::integer)
)
SELECT b.i AS bucket, count(e.ago) AS finished
FROM generate_series(0, $3::integer - 1) AS b(i)
LEFT JOIN (
    SELECT floor(extract(epoch FROM $1::timestamptz - ev.at) / $2::integer)::integer AS ago
    FROM since
    JOIN fleetq.events ev ON ev.id > since.id
    WHERE ev.at <= $1::timestamptz
      AND ev.kind IN ('succeeded', 'failed', 'cancelled', 'refused')
) e ON e.ago = $3::integer - 1 - b.i
GROUP BY b.i
ORDER BY b.i;

-- name: views_alerts
-- What needs an operator's eye: cancelled jobs whose stop the runner has not confirmed,
-- stops the runner could not confirm (it drained itself), jobs with two executions alive
-- at once (their windows are then read one job at a time), and queued jobs that no
-- online runner could take even when idle (the claim's own rule, evaluated with the
-- runner's whole capacity free, once per distinct job shape, not per job), and the first
-- $1 of those by id, which the overview's alert jobs list (views_alert_jobs lists the rest).
WITH shapes AS (
    SELECT lane, capabilities, requested_node, memory_mb, cpu_millis, count(*) AS jobs
    FROM fleetq.jobs
    WHERE state = 'queued'
    GROUP BY lane, capabilities, requested_node, memory_mb, cpu_millis
),
unplaceable AS (
    SELECT s.*
    FROM shapes s
    WHERE NOT EXISTS (
        SELECT 1
        FROM fleetq.runners r
        JOIN fleetq.runner_lanes l ON l.runner_id = r.id AND l.lane = s.lane
        WHERE r.state <> 'offline' AND NOT fleetq.runner_is_stale(r.last_heartbeat_at)
          AND fleetq.ineligibility(s.capabilities, s.requested_node, s.memory_mb, s.cpu_millis,
                                   r.node, r.capabilities, 'active', false,
                                   r.memory_mb, r.cpu_millis, l.slots, 0) IS NULL)
)
SELECT (SELECT count(*) FROM fleetq.jobs
        WHERE reserved_on IS NOT NULL AND state = 'cancelled') AS stops_pending,
       (SELECT count(*) FROM fleetq.runners
        WHERE state_reason LIKE 'stop-unconfirmed%') AS stops_unconfirmed,
       (SELECT coalesce(sum(jobs), 0) FROM unplaceable) AS unplaceable,
       ARRAY(SELECT j.id
             FROM fleetq.jobs j
             JOIN unplaceable u ON u.lane = j.lane AND u.capabilities = j.capabilities
                               AND u.requested_node IS NOT DISTINCT FROM j.requested_node
                               AND u.memory_mb = j.memory_mb AND u.cpu_millis = j.cpu_millis
             WHERE j.state = 'queued'
             ORDER BY j.id LIMIT $1::integer) AS unplaceable_jobs,
       ARRAY(SELECT job_id FROM fleetq.all_executions WHERE ended_at IS NULL
             GROUP BY job_id HAVING count(*) > 1 ORDER BY job_id) AS overlapping_jobs;

-- name: views_executions
-- Every execution of a job, by fencing token, with its claim time from the events (a
-- running handler's too, which is no row yet: fleetq.all_executions).
-- $1 job
SELECT x.*,
       (SELECT min(e.at) FROM fleetq.events e
        WHERE e.job_id = x.job_id AND e.kind = 'claimed'
          AND e.lease_version = x.lease_version) AS claimed_at
FROM fleetq.all_executions x
WHERE x.job_id = $1::bigint
ORDER BY x.lease_version;

-- name: views_job_budgets
-- What a job may spend before it fails: application attempts (its operation's retry
-- policy, 1 without one) and reassignments (the fleet's cap). A lost run is requeued once.
-- $1 job
SELECT coalesce((o.retry->>'max_attempts')::integer, 1) AS max_attempts,
       fleetq.setting_int('reassignment_cap') AS reassignment_cap
FROM fleetq.jobs j JOIN fleetq.operations o ON o.project = j.project AND o.name = j.operation
WHERE j.id = $1::bigint;

-- name: views_job_flaky
-- Tests flaky at this job's check (issue 47): named failing by a verdict of its project,
-- commit and operation that a later verdict of the same passed, its reports read
-- (stats_flaky, for one check; verdicts_by_check finds them). $1 job
SELECT DISTINCT f.test
FROM fleetq.jobs j
CROSS JOIN LATERAL (
    SELECT v.job_id, e #>> '{}' AS test
    FROM fleetq.verdicts v
    CROSS JOIN LATERAL jsonb_array_elements(
        CASE WHEN jsonb_typeof(v.provenance -> 'tests' -> 'failing') = 'array'
             THEN v.provenance -> 'tests' -> 'failing' ELSE '[]' END) e
    WHERE v.project = j.project AND v.commit_sha = j.commit_sha AND v.operation = j.operation
      AND jsonb_typeof(e) = 'string') f
WHERE j.id = $1::bigint
  AND EXISTS (SELECT 1 FROM fleetq.verdicts p
              WHERE p.project = j.project AND p.commit_sha = j.commit_sha
                AND p.operation = j.operation AND p.job_id > f.job_id AND p.verdict = 'passed'
                AND CASE WHEN jsonb_typeof(p.provenance -> 'tests' -> 'reports') = 'number'
                         THEN (p.provenance -> 'tests' ->> 'reports')::numeric > 0
                         ELSE false END)
ORDER BY f.test
LIMIT 50;

-- name: views_job_output
-- The recorded output tail of a job: its own verdict (one per job, migration 0011), and
-- what that verdict rests on (0041). $1 job
SELECT v.exit_code, v.reason, v.log_tail, fleetq.provenance_whole(v.provenance) AS provenance
FROM fleetq.verdicts v
WHERE v.job_id = $1::bigint;

-- name: views_queue_history
-- Queue samples of the last $2 minutes before $1 (one a minute per lane and class, written
-- by the reaper's leader), oldest first. Read by the primary key's leading column.
SELECT at, lane, priority_class, queued, oldest_wait_s, claimed, wait_p50_s, wait_max_s
FROM fleetq.queue_samples
WHERE at > $1::timestamptz - make_interval(mins => $2::integer) AND at <= $1::timestamptz
ORDER BY lane, priority_class, at;

-- name: views_may_act
-- Whether the console's login may cancel jobs and steer runners: a reader login may not,
-- and the console hides those actions rather than offer them and fail.
SELECT current_user AS login,
       has_function_privilege('fleetq.cancel(bigint,text,text)', 'EXECUTE') AS may_cancel,
       has_function_privilege('fleetq.set_runner_state(text,text,text,text)', 'EXECUTE')
           AS may_steer;

-- name: views_heartbeats
-- Each listed runner's last heartbeat and whether it is offline now: read once a second
-- while heartbeat ages are on screen (a whole overview read is not worth it for them).
SELECT r.id, r.last_heartbeat_at,
       r.state = 'offline' OR fleetq.runner_is_stale(r.last_heartbeat_at) AS offline
FROM fleetq.runners r
WHERE fleetq.runner_listed(r.forgotten_at, r.last_heartbeat_at);

-- name: views_cancel_many
-- Cancel many jobs in one statement, each through fleetq.cancel (the same check, audit
-- and stop-pending rule as `fleetq cancel`): one round trip for a chunk of a bulk cancel
-- instead of one per job. $1 job ids, $2 actor, $3 reason
SELECT c.*
FROM unnest($1::bigint[]) AS t(id)
CROSS JOIN LATERAL fleetq.cancel(t.id, $2::text, $3::text) c;

-- name: views_events_search
-- Incident search: events by runner, job, kind and time range, newest first, one page
-- at a time with no cap on how far back (the next page starts below the last id seen).
-- Walks the events' primary key down from $6: a page costs the rows it passes, so a
-- sparse filter over a long history reads further, never all of it for a full page; with
-- a start time the walk stops at the last event before it (found by walking the key back
-- from the newest, as views_runner_hour does), not at the first event ever.
-- $1 runner, $2 job, $3 kind, $4 from (inclusive), $5 until (exclusive), $6 below this
-- id (NULL: from the newest), $7 page size
SELECT e.*
FROM (SELECT CASE WHEN $4::timestamptz IS NULL THEN 0
                  ELSE (SELECT coalesce(max(id), 0) FROM fleetq.events
                        WHERE at < $4::timestamptz) END AS id) floor
JOIN fleetq.events e ON e.id > floor.id
WHERE ($1::text IS NULL OR e.runner_id = $1::text)
  AND ($2::bigint IS NULL OR e.job_id = $2::bigint)
  AND ($3::text IS NULL OR e.kind = $3::text)
  AND ($4::timestamptz IS NULL OR e.at >= $4::timestamptz)
  AND ($5::timestamptz IS NULL OR e.at < $5::timestamptz)
  AND ($6::bigint IS NULL OR e.id < $6::bigint)
ORDER BY e.id DESC
LIMIT $7::integer;

-- name: views_runner_hour
-- A runner's incidents since $2: how many of each kind of event it was part of (lease
-- expiries, self-fences, supersessions, stale writes rejected, reassignments...), a stop
-- it made by fencing itself counted as `self_fenced`, and the overlaps (two executions of
-- one job alive at once) it was one side of among the jobs it touched. $1 runner, $2 since.
-- The window's first id is found by walking the primary key back from the newest (as
-- views_queue_wait does): the cost follows the hour, not history.
WITH since AS (
    SELECT coalesce(max(id), 0) AS id FROM fleetq.events WHERE at < $2::timestamptz
),
mine AS (
    SELECT CASE WHEN e.kind = 'stopped' AND e.detail ->> 'reason' = 'self_fenced'
                THEN 'self_fenced' ELSE e.kind END AS kind,
           e.at, e.job_id
    FROM since JOIN fleetq.events e ON e.id > since.id
    WHERE e.runner_id = $1::text
),
overlapped AS (
    SELECT 'overlap' AS kind, greatest(a.launched_at, b.launched_at) AS at
    FROM (SELECT DISTINCT job_id FROM mine WHERE job_id IS NOT NULL) touched
    JOIN fleetq.all_executions a ON a.job_id = touched.job_id
    JOIN fleetq.all_executions b ON b.job_id = a.job_id AND b.lease_version > a.lease_version
    WHERE $1::text IN (a.runner_id, b.runner_id)
      AND b.launched_at < coalesce(a.ended_at, 'infinity')
      AND a.launched_at < coalesce(b.ended_at, 'infinity')
)
SELECT kind, count(*) AS events, max(at) AS last_at
FROM (SELECT kind, at FROM mine UNION ALL SELECT kind, at FROM overlapped) incidents
GROUP BY kind
ORDER BY count(*) DESC, kind;

-- name: views_alert_jobs
-- The jobs behind the overview's alerts, so an operator can open each: cancelled jobs
-- whose stop is pending, stops a runner could not confirm (the job its state reason
-- names) and jobs running twice at once; the queued jobs no runner can take come with
-- views_alerts, which finds them. $1 at most this many of each.
(SELECT id AS job_id, 'stop pending' AS alert, reserved_on AS runner_id
 FROM fleetq.jobs WHERE reserved_on IS NOT NULL AND state = 'cancelled'
 ORDER BY id LIMIT $1::integer)
UNION ALL
(SELECT substring(state_reason FROM 'job ([0-9]{1,18})')::bigint, 'stop unconfirmed', id
 FROM fleetq.runners
 WHERE state_reason LIKE 'stop-unconfirmed%' AND state_reason ~ 'job [0-9]{1,18}'
 ORDER BY id LIMIT $1::integer)
UNION ALL
(SELECT job_id, 'overlap', min(runner_id)
 FROM fleetq.all_executions WHERE ended_at IS NULL
 GROUP BY job_id HAVING count(*) > 1 ORDER BY job_id LIMIT $1::integer);
