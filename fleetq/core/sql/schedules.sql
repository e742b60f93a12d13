-- Schedules: what the runners of their lanes settle, and what `fleetq schedules` shows.

-- name: schedules_of_lanes
-- The schedules in force of the lanes runner $1 serves that no other runner has the turn
-- on, with their project's repository (through the runner's function), each row with the
-- database's clock; one row with the clock alone when there are none. One statement a
-- minute per runner, none more when there is nothing due.
SELECT c.now, s.*
FROM (SELECT clock_timestamp() AS now) c
LEFT JOIN LATERAL fleetq.lane_schedules($1::text) s ON true;

-- name: schedules_take_turn
-- Take the turn on a due tick (one runner of the lane resolves it). $1 runner,
-- $2 schedule, $3 tick
SELECT fleetq.take_schedule_turn($1::text, $2::text, $3::timestamptz) AS taken;

-- name: schedules_fire
-- Fire one tick: the tick's row and the job's submit in one transaction (once per tick).
-- $1 schedule, $2 tick, $3 commit
SELECT * FROM fleetq.fire_schedule($1::text, $2::timestamptz, $3::text);

-- name: schedules_skip
-- Settle the ticks through $2 without firing them (the catch-up rule). $1 schedule
SELECT fleetq.skip_schedule($1::text, $2::timestamptz);

-- name: schedules_list
-- Every schedule with its newest fired tick and that tick's job.
SELECT s.name, s.cron, s.timezone, s.project, s.operation, s.commit_sha, s.branch,
       s.catch_up, s.last_tick, s.paused_at, s.paused_by, s.paused_reason,
       t.tick AS last_fired, t.job_id AS last_job
FROM fleetq.schedules s
LEFT JOIN LATERAL (SELECT tick, job_id FROM fleetq.schedule_ticks
                   WHERE schedule = s.name ORDER BY tick DESC LIMIT 1) t ON true
ORDER BY s.name;

-- name: schedules_pause
-- $1 schedule, $2 paused (false: resume), $3 reason, $4 actor
SELECT fleetq.pause_schedule($1::text, $2::boolean, $3::text, $4::text) AS paused;

-- name: schedules_remove
-- Remove a schedule (its tick rows go with it; the jobs it fired stay). The fleet's
-- configuration is its owner's, as `fleetq apply` is. $1 schedule, $2 actor
WITH gone AS (DELETE FROM fleetq.schedules WHERE name = $1::text RETURNING name),
logged AS (
    INSERT INTO fleetq.events (kind, actor, detail)
    SELECT 'schedule_removed', $2::text, jsonb_build_object('schedule', name) FROM gone
)
SELECT count(*) AS removed FROM gone;
