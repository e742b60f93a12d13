-- Removing what is no longer wanted while keeping its history (issue 14): an operation
-- is retired (`fleetq config remove operation P/O`), a runner is forgotten (`fleetq
-- runners forget RUNNER`). Neither row is deleted: jobs, results and executions name
-- them, and their history must keep its meaning.

ALTER TABLE fleetq.operations
    ADD COLUMN retired_at timestamptz,
    ADD COLUMN retired_by text;

ALTER TABLE fleetq.runners
    ADD COLUMN forgotten_at timestamptz,
    ADD COLUMN forgotten_by text;

-- Whether a runner is listed: forgotten runners are not, until they are heard from again
-- (a runner that registers or heartbeats after it was forgotten is back, with no step of
-- its own: the hot path is untouched).
CREATE FUNCTION fleetq.runner_listed(p_forgotten_at timestamptz, p_last_heartbeat timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_forgotten_at IS NULL OR p_last_heartbeat > p_forgotten_at
$$;

-- Submit as before, but the operation is read under the same KEY SHARE lock the job's
-- foreign key takes anyway (no extra cost), and a retired operation is refused. The
-- lock orders a submit against a removal (which locks the row FOR UPDATE): a submit in
-- flight finishes first and its job counts as live for the removal; a later submit sees
-- the operation retired.
CREATE OR REPLACE FUNCTION fleetq.submit_unchecked(
    p_project text, p_operation text, p_commit text, p_requested_node text,
    p_idempotency_key text, p_task_id text, p_submitted_by text, p_payload jsonb
) RETURNS TABLE (job_id bigint, created boolean, state text, priority_class smallint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_gate boolean;
    v_op fleetq.operations%ROWTYPE;
    v_class smallint;
    v_id bigint;
    v_old fleetq.jobs%ROWTYPE;
    v_limit integer := fleetq.setting_int('max_payload_bytes');
BEGIN
    SELECT release_gate INTO v_gate FROM fleetq.projects WHERE name = p_project;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown project %', p_project USING ERRCODE = 'FQ002';
    END IF;
    SELECT * INTO v_op FROM fleetq.operations WHERE project = p_project AND name = p_operation
    FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'project % does not allow operation %', p_project, p_operation
            USING ERRCODE = 'FQ002';
    END IF;
    IF v_op.retired_at IS NOT NULL THEN
        RAISE EXCEPTION 'operation %/% was removed (by %, at %)', p_project, p_operation,
            v_op.retired_by, v_op.retired_at USING ERRCODE = 'FQ002';
    END IF;
    IF p_commit IS NULL OR p_commit !~ '^[0-9a-f]{40}$' THEN
        RAISE EXCEPTION 'commit must be a full 40-character hex SHA' USING ERRCODE = 'FQ003';
    END IF;
    IF octet_length(p_payload::text) > v_limit THEN
        RAISE EXCEPTION 'payload is % bytes, over the limit of %', octet_length(p_payload::text),
            v_limit USING ERRCODE = 'FQ003';
    END IF;
    -- Priority is derived, never chosen: release verification, then release gates, then
    -- everything else.
    v_class := CASE
        WHEN EXISTS (SELECT 1 FROM fleetq.identities
                     WHERE name = p_submitted_by AND role = 'release-verification') THEN 0
        WHEN v_gate THEN 1
        ELSE 2
    END;

    INSERT INTO fleetq.jobs
        (project, operation, commit_sha, lane, capabilities, memory_mb, cpu_millis, timeout_s,
         requested_node, idempotency_key, task_id, submitted_by, payload, priority_class)
    VALUES
        (p_project, p_operation, p_commit, v_op.lane, v_op.capabilities, v_op.memory_mb,
         v_op.cpu_millis, v_op.timeout_s, p_requested_node, p_idempotency_key, p_task_id,
         p_submitted_by, coalesce(p_payload, '{}'), v_class)
    ON CONFLICT (project, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id INTO v_id;

    IF v_id IS NOT NULL THEN
        PERFORM fleetq.log_events('submitted', ARRAY[v_id], NULL, ARRAY[0::bigint], p_submitted_by,
                                  jsonb_build_object('priority_class', v_class));
        PERFORM pg_notify('fleetq_work', v_op.lane);
        RETURN QUERY SELECT v_id, true, 'queued'::text, v_class;
        RETURN;
    END IF;

    -- The key exists. This is a second statement on purpose: it takes a new snapshot, so
    -- it sees a job that a concurrent submit committed while the INSERT above waited.
    SELECT * INTO v_old FROM fleetq.jobs j
    WHERE j.project = p_project AND j.idempotency_key = p_idempotency_key;
    IF (v_old.operation, v_old.commit_sha, v_old.requested_node, v_old.task_id,
        v_old.submitted_by, v_old.payload)
       IS DISTINCT FROM
       (p_operation, p_commit, p_requested_node, p_task_id, p_submitted_by,
        coalesce(p_payload, '{}'::jsonb)) THEN
        RAISE EXCEPTION 'idempotency key already names job % of project % with other parameters',
            v_old.id, p_project USING ERRCODE = 'FQ001';
    END IF;
    RETURN QUERY SELECT v_old.id, false, v_old.state, v_old.priority_class;
END;
$$;

-- Retire an operation: refused while it has live jobs (queued, claimed or running), which
-- would otherwise run under a definition nobody can see any more. Removing a retired
-- operation again is a no-op; `fleetq apply` with the operation in it brings it back.
-- The configuration is the owner's (as `fleetq apply` is): no grant.
CREATE FUNCTION fleetq.retire_operation(p_project text, p_operation text, p_actor text)
RETURNS TABLE (removed boolean, retired_at timestamptz, jobs bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_retired timestamptz;
    v_live bigint;
    v_jobs bigint;
BEGIN
    SELECT o.retired_at INTO v_retired FROM fleetq.operations o
    WHERE o.project = p_project AND o.name = p_operation
    FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'project % has no operation %', p_project, p_operation
            USING ERRCODE = 'FQ002';
    END IF;
    -- a new statement, so a new snapshot: it sees the jobs of submits that held the row
    -- while this one waited for it
    SELECT count(*) FILTER (WHERE j.state IN ('queued', 'claimed', 'running')), count(*)
    INTO v_live, v_jobs
    FROM fleetq.jobs j WHERE j.project = p_project AND j.operation = p_operation;
    IF v_retired IS NOT NULL THEN
        RETURN QUERY SELECT false, v_retired, v_jobs;
        RETURN;
    END IF;
    IF v_live > 0 THEN
        RAISE EXCEPTION 'operation %/% has % live job(s) (queued, claimed or running): '
            'cancel them or let them finish, then remove it', p_project, p_operation, v_live
            USING ERRCODE = 'FQ006';
    END IF;
    UPDATE fleetq.operations o SET retired_at = clock_timestamp(), retired_by = p_actor
    WHERE o.project = p_project AND o.name = p_operation
    RETURNING o.retired_at INTO v_retired;
    PERFORM fleetq.log_events('operation_removed', NULL, NULL, NULL, p_actor,
                              jsonb_build_object('project', p_project,
                                                 'operation', p_operation, 'jobs', v_jobs));
    RETURN QUERY SELECT true, v_retired, v_jobs;
END;
$$;

-- Forget a runner that is gone for good: it is no longer listed, counted as capacity or
-- offered as eligible; its executions and events stay. Only an offline runner (stopped,
-- or silent past the offline threshold) holding nothing may be forgotten: its leases
-- are the reaper's to recover first. An operator's lever, as drain is.
CREATE FUNCTION fleetq.forget_runner(p_runner text, p_actor text)
RETURNS SETOF fleetq.runners
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
$$;

INSERT INTO fleetq.grants (privilege, object, grantee) VALUES
    ('EXECUTE', 'FUNCTION fleetq.forget_runner(text, text)', 'fleetq_operator'),
    ('EXECUTE', 'FUNCTION fleetq.runner_listed(timestamptz, timestamptz)', 'fleetq_reader'),
    ('EXECUTE', 'FUNCTION fleetq.runner_listed(timestamptz, timestamptz)', 'fleetq_operator'),
    ('EXECUTE', 'FUNCTION fleetq.runner_listed(timestamptz, timestamptz)', 'fleetq_submitter');

SELECT fleetq.secure();
