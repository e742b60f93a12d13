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
-- Forgotten runners are left out until they are heard from again.
SELECT r.*,
       (r.state = 'offline' OR fleetq.runner_is_stale(r.last_heartbeat_at)) AS offline,
       coalesce((SELECT jsonb_object_agg(l.lane, jsonb_build_array(l.slots, l.slots_used))
                 FROM fleetq.runner_lanes l WHERE l.runner_id = r.id), '{}') AS lanes,
       (SELECT count(*) FROM fleetq.jobs j WHERE j.reserved_on = r.id) AS live_jobs
FROM fleetq.runners r
WHERE fleetq.runner_listed(r.forgotten_at, r.last_heartbeat_at)
ORDER BY r.id;

-- name: runners_get_state
-- A runner's own state, which it follows (paused, draining, drained). $1 runner
SELECT * FROM fleetq.runner_state($1::text);

-- name: runners_lease_seconds
-- The lease length runners heartbeat against, and how long a silent runner stays
-- online (a runner renews often enough for both).
SELECT * FROM fleetq.runner_timing();

-- name: runners_take_identity
-- One process per runner id, held by the runner's LISTEN connection: taken (taken = true),
-- or the session holding it (pid, login, application_name). $1 runner
SELECT * FROM fleetq.take_runner_id($1::text);

-- name: runners_hold_identity
-- One process per runner id for a runner served through the API: held for $3 seconds by
-- holder $2 (renewed by asking again), or the other holder and how long it has left.
-- $1 runner
SELECT * FROM fleetq.hold_runner_id($1::text, $2::text, $3::integer);

-- name: runners_session_alive
-- Whether a database session is still there. $1 backend pid
SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1::integer) AS alive;

-- name: runners_end_session
-- End a session this very process left behind on the server (a partition outlived
-- by its backend), so that it gives the runner id's lock up. $1 backend pid
SELECT pg_terminate_backend($1::integer) AS ended;

-- name: runners_end_predecessors
-- End the pooled sessions an earlier process of this runner left behind (their
-- application_name carries the runner's hash and that process's token).
-- $1 LIKE pattern for this runner's pooled sessions, $2 this process's own name
SELECT pid, pg_terminate_backend(pid) AS ended
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND application_name LIKE $1::text AND application_name <> $2::text;

-- name: runners_forget
-- Forget an offline runner that holds nothing; its history stays. $1 runner, $2 actor
SELECT * FROM fleetq.forget_runner($1::text, $2::text);
