-- The runner registry and operator state.

-- name: runners_register
-- $1 node, $2 name, $3 capabilities, $4 memory MB, $5 millicpus, $6 lanes, $7 slots,
-- $8 version, $9 pid
SELECT * FROM fleetq.register_runner($1::text, $2::text, $3::text[], $4::integer, $5::integer,
                                     $6::text[], $7::integer[], $8::text, $9::integer);

-- name: runners_set_state
-- $1 runner, $2 state (active, paused, draining, offline), $3 reason, $4 actor
SELECT * FROM fleetq.set_runner_state($1::text, $2::text, $3::text, $4::text);

-- name: runners_list
-- Every runner with its lanes and live work; `offline` folds in a stale heartbeat.
SELECT r.*,
       (r.state = 'offline' OR fleetq.runner_is_stale(r.last_heartbeat_at)) AS offline,
       coalesce((SELECT jsonb_object_agg(l.lane, jsonb_build_array(l.slots, l.slots_used))
                 FROM fleetq.runner_lanes l WHERE l.runner_id = r.id), '{}') AS lanes,
       (SELECT count(*) FROM fleetq.jobs j WHERE j.reserved_on = r.id) AS live_jobs
FROM fleetq.runners r
ORDER BY r.id;

-- name: runners_get_state
-- A runner's own state, which it follows (paused, draining, drained). $1 runner
SELECT state, state_reason FROM fleetq.runners WHERE id = $1::text;

-- name: runners_lease_seconds
-- The lease length runners heartbeat against.
SELECT fleetq.setting_int('lease_seconds') AS lease_seconds;
