-- Protocol: the fleet: runners register (and re-register), operators drain, pause, resume and
-- forget them.
--
-- Applied by `fleetq migrate` whenever this file changes (CREATE OR REPLACE; every
-- changed protocol file in one transaction). Change a function here; tables, dropped
-- functions and new signatures go in a numbered migration.

-- Register (or re-register after a restart: the id node/name is stable) a runner.
-- Reservations are recomputed from the jobs it holds, so a restart heals any drift.
CREATE OR REPLACE FUNCTION fleetq.register_runner_unchecked(p_node text, p_name text, p_capabilities text[], p_memory_mb integer, p_cpu_millis integer, p_lanes text[], p_slots integer[], p_version text, p_pid integer)
 RETURNS SETOF fleetq.runners
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_id text := p_node || '/' || p_name;
    v_unknown text;
BEGIN
    SELECT string_agg(l, ', ') INTO v_unknown
    FROM unnest(p_lanes) l WHERE l NOT IN (SELECT name FROM fleetq.lanes);
    IF v_unknown IS NOT NULL THEN
        RAISE EXCEPTION 'unknown lane(s) %; registered: %', v_unknown,
            (SELECT coalesce(string_agg(name, ', ' ORDER BY name), 'none') FROM fleetq.lanes)
            USING ERRCODE = 'FQ002', HINT = 'declare lanes with `fleetq apply`';
    END IF;
    INSERT INTO fleetq.runners AS r
        (id, node, name, capabilities, memory_mb, cpu_millis, version, pid)
    VALUES (v_id, p_node, p_name, coalesce(p_capabilities, '{}'), p_memory_mb, p_cpu_millis,
            coalesce(p_version, ''), p_pid)
    ON CONFLICT (id) DO UPDATE SET
        capabilities = EXCLUDED.capabilities, memory_mb = EXCLUDED.memory_mb,
        cpu_millis = EXCLUDED.cpu_millis, version = EXCLUDED.version, pid = EXCLUDED.pid,
        last_heartbeat_at = clock_timestamp(), registered_at = clock_timestamp(),
        -- an operator's pause or drain outlives a restart; 'offline' does not
        state = CASE WHEN r.state = 'offline' THEN 'active' ELSE r.state END,
        state_changed_at = CASE WHEN r.state = 'offline' THEN clock_timestamp()
                                ELSE r.state_changed_at END;
    PERFORM 1 FROM fleetq.runners WHERE id = v_id FOR UPDATE;
    DELETE FROM fleetq.runner_lanes l
    WHERE l.runner_id = v_id AND l.lane <> ALL (p_lanes)
      AND NOT EXISTS (SELECT 1 FROM fleetq.jobs j WHERE j.reserved_on = v_id AND j.lane = l.lane);
    INSERT INTO fleetq.runner_lanes (runner_id, lane, slots)
    SELECT v_id, t.lane, t.slots FROM unnest(p_lanes, p_slots) AS t(lane, slots)
    ON CONFLICT (runner_id, lane) DO UPDATE SET slots = EXCLUDED.slots;
    BEGIN
        UPDATE fleetq.runners r
        SET reserved_memory_mb = h.memory, reserved_cpu_millis = h.cpu
        FROM (SELECT coalesce(sum(memory_mb), 0)::integer AS memory,
                     coalesce(sum(cpu_millis), 0)::integer AS cpu
              FROM fleetq.jobs WHERE reserved_on = v_id) h
        WHERE r.id = v_id;
        UPDATE fleetq.runner_lanes l
        SET slots_used = (SELECT count(*) FROM fleetq.jobs j
                          WHERE j.reserved_on = v_id AND j.lane = l.lane)
        WHERE l.runner_id = v_id;
    EXCEPTION WHEN check_violation THEN
        RAISE EXCEPTION 'runner % holds jobs that need more than the capacity it now declares; '
                        'let them finish (drain) before shrinking it', v_id
            USING ERRCODE = 'FQ005';
    END;
    PERFORM fleetq.log_events('runner_registered', NULL, v_id, NULL, NULL,
                              jsonb_build_object('lanes', p_lanes, 'slots', p_slots,
                                                 'capabilities', p_capabilities));
    RETURN QUERY SELECT * FROM fleetq.runners WHERE id = v_id;
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.register_runner(p_node text, p_name text, p_capabilities text[], p_memory_mb integer, p_cpu_millis integer, p_lanes text[], p_slots integer[], p_version text, p_pid integer)
 RETURNS SETOF fleetq.runners
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    PERFORM fleetq.acting_runner(p_node || '/' || p_name);
    -- what a runner says of itself is shown to operators: bounded, no control characters
    PERFORM fleetq.refuse_bad_text(p_node, 'node');
    PERFORM fleetq.refuse_bad_text(p_name, 'runner name');
    PERFORM fleetq.refuse_bad_text(nullif(p_version, ''), 'version');
    IF cardinality(p_capabilities) > 256
       OR EXISTS (SELECT 1 FROM unnest(p_capabilities) c WHERE c IS NULL OR fleetq.bad_text(c)) THEN
        RAISE EXCEPTION 'capabilities are at most 256 names, each 1 to 256 bytes without '
            'control characters' USING ERRCODE = 'FQ003';
    END IF;
    RETURN QUERY SELECT * FROM fleetq.register_runner_unchecked(
        p_node, p_name, p_capabilities, p_memory_mb, p_cpu_millis, p_lanes, p_slots, p_version,
        p_pid);
END;
$function$;

-- Operator (and runner shutdown) state changes: drain, pause, resume, offline.
CREATE OR REPLACE FUNCTION fleetq.set_runner_state_unchecked(p_runner text, p_state text, p_reason text, p_actor text)
 RETURNS SETOF fleetq.runners
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_state text := p_state;
BEGIN
    IF p_state NOT IN ('active', 'paused', 'draining', 'offline') THEN
        RAISE EXCEPTION 'a runner can be set active, paused, draining or offline'
            USING ERRCODE = 'FQ003';
    END IF;
    PERFORM 1 FROM fleetq.runners WHERE id = p_runner FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown runner %', p_runner USING ERRCODE = 'FQ004';
    END IF;
    IF p_state = 'draining' AND NOT EXISTS (SELECT 1 FROM fleetq.jobs WHERE reserved_on = p_runner) THEN
        v_state := 'drained';  -- nothing to wait for
    END IF;
    UPDATE fleetq.runners
    SET state = v_state, state_reason = p_reason, state_actor = p_actor,
        state_changed_at = clock_timestamp()
    WHERE id = p_runner;
    PERFORM fleetq.log_events('runner_' || v_state, NULL, p_runner, NULL, p_actor,
                              jsonb_build_object('reason', p_reason));
    PERFORM pg_notify('fleetq_control', 'runner:' || p_runner);
    RETURN QUERY SELECT * FROM fleetq.runners WHERE id = p_runner;
END;
$function$;

-- A runner changes its own state (drains itself, goes offline at shutdown); an operator
-- any runner's, recorded under the operator's identity. A runner never undoes what an
-- operator set: it may only drain or go offline, and only from a state it set itself
-- (a runner login set itself active over an operator's pause; and 'offline' is what a
-- restart turns back to active).
CREATE OR REPLACE FUNCTION fleetq.set_runner_state(p_runner text, p_state text, p_reason text, p_actor text)
 RETURNS SETOF fleetq.runners
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    c record;
    v_actor text := p_actor;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['runner', 'operator']);
    IF c.kind = 'runner' THEN
        PERFORM fleetq.acting_runner(p_runner);
        v_actor := c.subject;
        IF p_state NOT IN ('draining', 'offline') THEN
            RAISE EXCEPTION 'a runner may drain itself or go offline; % is an operator''s',
                            p_state
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF EXISTS (SELECT 1 FROM fleetq.runners r
                   WHERE r.id = p_runner AND r.state NOT IN ('active', 'offline')
                     AND r.state_actor IS DISTINCT FROM c.subject) THEN
            RETURN QUERY SELECT * FROM fleetq.runners r WHERE r.id = p_runner;
            RETURN;  -- the operator's state stands
        END IF;
    ELSIF c.kind = 'operator' THEN
        v_actor := c.subject;
    END IF;
    -- a reason is shown to operators: bounded as a runner's outcome reasons are
    RETURN QUERY SELECT * FROM fleetq.set_runner_state_unchecked(p_runner, p_state,
                                                                 left(p_reason, 2000), v_actor);
END;
$function$;

-- Forget a runner that is gone for good: it is no longer listed, counted as capacity or
-- offered as eligible; its executions and events stay. Only an offline runner (stopped,
-- or silent past the offline threshold) holding nothing may be forgotten: its leases
-- are the reaper's to recover first. An operator's lever, as drain is.
CREATE OR REPLACE FUNCTION fleetq.forget_runner(p_runner text, p_actor text)
 RETURNS SETOF fleetq.runners
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    c record;
    r fleetq.runners%ROWTYPE;
    v_actor text := p_actor;
    v_held bigint;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['operator']);
    IF c.kind = 'operator' THEN
        v_actor := c.subject;
    END IF;
    SELECT * INTO r FROM fleetq.runners WHERE id = p_runner FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown runner %', p_runner USING ERRCODE = 'FQ004';
    END IF;
    IF NOT fleetq.runner_listed(r.forgotten_at, r.last_heartbeat_at) THEN
        RETURN NEXT r;  -- forgotten already
        RETURN;
    END IF;
    IF r.state <> 'offline' AND NOT fleetq.runner_is_stale(r.last_heartbeat_at) THEN
        RAISE EXCEPTION 'runner % is % and was heard from % ago: only an offline runner can '
            'be forgotten (stop it, or wait until it counts as offline)', p_runner, r.state,
            date_trunc('second', clock_timestamp() - r.last_heartbeat_at)
            USING ERRCODE = 'FQ006';
    END IF;
    SELECT count(*) INTO v_held FROM fleetq.jobs j WHERE j.reserved_on = p_runner;
    IF v_held > 0 THEN
        RAISE EXCEPTION 'runner % still holds % job(s): their leases are recovered when they '
            'expire (the reaper), forget it after that', p_runner, v_held
            USING ERRCODE = 'FQ006';
    END IF;
    UPDATE fleetq.runners SET forgotten_at = clock_timestamp(), forgotten_by = v_actor
    WHERE id = p_runner RETURNING * INTO r;
    PERFORM fleetq.log_events('runner_forgotten', NULL, p_runner, NULL, v_actor, '{}');
    PERFORM pg_notify('fleetq_control', 'runner:' || p_runner);
    RETURN NEXT r;
END;
$function$;

-- Why each registered runner could or could not take jobs of these shapes (the claim's own
-- rule, fleetq.ineligibility): `fleetq explain`, the console and the warning a submit
-- gives when no runner could ever run the job. A function of its own so a submitter
-- (and the API's gateway, for a submitter's token) can be told why its job waits
-- without reading the runner tables: it answers the runners' verdicts for these jobs
-- and nothing else of theirs. One row per (distinct shape among the jobs, runner).
CREATE OR REPLACE FUNCTION fleetq.explain_jobs(p_jobs bigint[])
 RETURNS TABLE(lane text, capabilities text[], requested_node text, memory_mb integer,
               cpu_millis integer, runner_id text, node text, reason text,
               needs_memory_mb integer, needs_cpu_millis integer,
               missing_capabilities text[], free_memory_mb integer, free_cpu_millis integer,
               total_memory_mb integer, total_cpu_millis integer, slots integer,
               slots_used integer)
 LANGUAGE plpgsql
 STABLE
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    PERFORM fleetq.require(ARRAY['submitter', 'operator', 'reader']);
    RETURN QUERY
    WITH shapes AS (
        SELECT DISTINCT j.lane, j.capabilities, j.requested_node, j.memory_mb, j.cpu_millis
        FROM fleetq.jobs j
        WHERE j.id = ANY (p_jobs)
    )
    SELECT s.lane, s.capabilities, s.requested_node, s.memory_mb, s.cpu_millis,
           r.id,
           r.node,
           fleetq.ineligibility(s.capabilities, s.requested_node, s.memory_mb, s.cpu_millis,
                                r.node, r.capabilities, r.state,
                                fleetq.runner_is_stale(r.last_heartbeat_at),
                                r.memory_mb - r.reserved_memory_mb,
                                r.cpu_millis - r.reserved_cpu_millis,
                                l.slots, l.slots_used),
           s.memory_mb,
           s.cpu_millis,
           ARRAY(SELECT c FROM unnest(s.capabilities) c
                 EXCEPT SELECT c FROM unnest(r.capabilities) c ORDER BY 1),
           r.memory_mb - r.reserved_memory_mb,
           r.cpu_millis - r.reserved_cpu_millis,
           r.memory_mb,
           r.cpu_millis,
           l.slots,
           l.slots_used
    FROM shapes s
    CROSS JOIN fleetq.runners r
    LEFT JOIN fleetq.runner_lanes l ON l.runner_id = r.id AND l.lane = s.lane
    WHERE fleetq.runner_listed(r.forgotten_at, r.last_heartbeat_at)
    ORDER BY r.id;
END;
$function$;
