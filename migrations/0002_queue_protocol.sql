-- 0002_queue_protocol: every state transition of a job, as one database function each.
--
-- Why functions: every driver and every language gets the same guarded behaviour, and a
-- runner's login can later be limited to EXECUTE on these. The protocol they implement
-- is stated once in fleetq/core/leasing.py; in short:
--
-- * claim bumps lease_version (the fencing token) and reserves the runner's capacity in
--   the same statement; every later write by the runner names (job, owner, version) and
--   touches 0 rows when any of them moved on: the caller is told 'stale', never 'ok'.
-- * A retry of a write that already committed (its reply was lost) answers 'already'.
-- * Lease time is clock_timestamp(), never now() (fixed at transaction start).
-- * Each transition appends an event row and sends NOTIFY hints that carry ids or lane
--   names only, never payloads: fleetq_work (payload: lane) wakes claim loops,
--   fleetq_events (no payload) wakes the console, fleetq_control ('job:ID', 'runner:ID')
--   wakes the runner whose job or state an operator changed.
--
-- Lock order, to rule out deadlocks: jobs (by id) -> runners (by id) -> runner_lanes.
-- The claim locks its runner first, but only SKIP LOCKs jobs, so it never waits on one.
--
-- Errors raised here use SQLSTATE class FQ (mapped to fleetq.core.errors):
--   FQ001 idempotency conflict, FQ002 not allowed, FQ003 invalid input,
--   FQ004 not found, FQ005 capacity conflict.

-- ---------------------------------------------------------------------------------------
-- Helpers

CREATE FUNCTION fleetq.setting_int(p_name text) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT (value #>> '{}')::integer FROM fleetq.settings WHERE name = p_name
$$;

CREATE FUNCTION fleetq.setting_seconds(p_name text) RETURNS interval
LANGUAGE sql STABLE AS $$
    SELECT make_interval(secs => fleetq.setting_int(p_name))
$$;

-- THE eligibility rule (DESIGN §3 "match before claim"): NULL when a runner can take the
-- job now, else the first failing reason. The claim filters on it and `explain` reports
-- it, so the two cannot disagree. Permanent reasons come first (the runner could never
-- run the job), then the runner's state, then capacity that may free up.
CREATE FUNCTION fleetq.ineligibility(
    j_capabilities    text[],
    j_requested_node  text,
    j_memory_mb       integer,
    j_cpu_millis      integer,
    r_node            text,
    r_capabilities    text[],
    r_state           text,
    r_offline         boolean,
    r_free_memory_mb  integer,
    r_free_cpu_millis integer,
    l_slots           integer,   -- NULL: the runner does not serve the job's lane
    l_slots_used      integer
) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN l_slots IS NULL THEN 'lane'
        WHEN NOT (j_capabilities <@ r_capabilities) THEN 'capability'
        WHEN j_requested_node IS NOT NULL AND j_requested_node <> r_node THEN 'node'
        WHEN r_offline OR r_state = 'offline' THEN 'offline'
        WHEN r_state <> 'active' THEN r_state
        WHEN l_slots_used >= l_slots THEN 'slots'
        WHEN j_memory_mb > r_free_memory_mb THEN 'memory'
        WHEN j_cpu_millis > r_free_cpu_millis THEN 'cpu'
    END
$$;

-- The claim's filter: ineligibility(...) IS NULL, in plpgsql on purpose. An inlined
-- expression would be estimated to pass 0.5% of rows, and the planner would then read
-- and sort a whole lane instead of walking jobs_queued in order and stopping at the
-- limit; an opaque boolean function is estimated at 1/3, which keeps the ordered index
-- scan (test_query_plans.py checks it).
CREATE FUNCTION fleetq.eligible(
    j_capabilities text[], j_requested_node text, j_memory_mb integer, j_cpu_millis integer,
    r_node text, r_capabilities text[], r_state text, r_offline boolean,
    r_free_memory_mb integer, r_free_cpu_millis integer, l_slots integer, l_slots_used integer
) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RETURN fleetq.ineligibility(j_capabilities, j_requested_node, j_memory_mb, j_cpu_millis,
                                r_node, r_capabilities, r_state, r_offline, r_free_memory_mb,
                                r_free_cpu_millis, l_slots, l_slots_used) IS NULL;
END;
$$;

-- Whether a runner's heartbeat is too old: it is then offline, whatever its state says.
CREATE FUNCTION fleetq.runner_is_stale(p_last_heartbeat timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_last_heartbeat < clock_timestamp() - fleetq.setting_seconds('runner_offline_after_seconds')
$$;

-- Append events (one per job, or one with no job) and wake the console.
CREATE FUNCTION fleetq.log_events(
    p_kind text, p_jobs bigint[], p_runner text, p_versions bigint[], p_actor text,
    p_detail jsonb DEFAULT '{}'
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_jobs IS NULL THEN
        INSERT INTO fleetq.events (kind, runner_id, actor, detail)
        VALUES (p_kind, p_runner, p_actor, p_detail);
    ELSIF cardinality(p_jobs) > 0 THEN
        INSERT INTO fleetq.events (kind, job_id, runner_id, lease_version, actor, detail)
        SELECT p_kind, j, p_runner, v, p_actor, p_detail
        FROM unnest(p_jobs, p_versions) AS t(j, v);
    ELSE
        RETURN;
    END IF;
    PERFORM pg_notify('fleetq_events', '');
END;
$$;

-- Give back capacity reserved by jobs whose lease ended (one row per job). Callers clear
-- jobs.reserved_on in their own UPDATE and pass the values it had.
CREATE FUNCTION fleetq.give_back(
    p_runners text[], p_lanes text[], p_memory integer[], p_cpu integer[]
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(cardinality(p_runners), 0) = 0 THEN
        RETURN;
    END IF;
    PERFORM 1 FROM fleetq.runners WHERE id = ANY (p_runners) ORDER BY id FOR UPDATE;
    UPDATE fleetq.runners r
    SET reserved_memory_mb = r.reserved_memory_mb - g.memory,
        reserved_cpu_millis = r.reserved_cpu_millis - g.cpu
    FROM (SELECT runner, sum(memory)::integer AS memory, sum(cpu)::integer AS cpu
          FROM unnest(p_runners, p_memory, p_cpu) AS t(runner, memory, cpu)
          GROUP BY runner) g
    WHERE r.id = g.runner;
    UPDATE fleetq.runner_lanes l
    SET slots_used = l.slots_used - g.n
    FROM (SELECT runner, lane, count(*)::integer AS n
          FROM unnest(p_runners, p_lanes) AS t(runner, lane)
          GROUP BY runner, lane) g
    WHERE l.runner_id = g.runner AND l.lane = g.lane;
END;
$$;

-- The verdict and task-thread notification of jobs that just reached a terminal state,
-- in the same transaction as that state (DESIGN §3 "Record").
CREATE FUNCTION fleetq.record_outcomes(
    p_jobs bigint[], p_exit_codes integer[], p_log_tails text[],
    p_prepare_ms integer[], p_run_ms integer[]
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fleetq.results AS r
        (project, commit_sha, operation, job_id, verdict, exit_code, reason, log_tail,
         prepare_ms, run_ms)
    SELECT DISTINCT ON (j.project, j.commit_sha, j.operation)
           j.project, j.commit_sha, j.operation, j.id,
           CASE j.state WHEN 'succeeded' THEN 'passed' ELSE j.state END,
           t.exit_code, j.failure_reason, coalesce(t.log_tail, ''), t.prepare_ms, t.run_ms
    FROM unnest(p_jobs, p_exit_codes, p_log_tails, p_prepare_ms, p_run_ms)
         AS t(job_id, exit_code, log_tail, prepare_ms, run_ms)
    JOIN fleetq.jobs j ON j.id = t.job_id
    ORDER BY j.project, j.commit_sha, j.operation, j.id DESC
    ON CONFLICT (project, commit_sha, operation) DO UPDATE SET
        job_id = EXCLUDED.job_id, verdict = EXCLUDED.verdict, exit_code = EXCLUDED.exit_code,
        reason = EXCLUDED.reason, log_tail = EXCLUDED.log_tail,
        prepare_ms = EXCLUDED.prepare_ms, run_ms = EXCLUDED.run_ms,
        recorded_at = clock_timestamp()
    -- the newest job's verdict wins when two jobs checked the same thing
    WHERE r.job_id <= EXCLUDED.job_id;

    INSERT INTO fleetq.task_notifications (task_id, job_id, state, verdict)
    SELECT j.task_id, j.id, j.state, CASE j.state WHEN 'succeeded' THEN 'passed' ELSE j.state END
    FROM fleetq.jobs j
    WHERE j.id = ANY (p_jobs) AND j.task_id IS NOT NULL;
END;
$$;

-- ---------------------------------------------------------------------------------------
-- Submit

CREATE FUNCTION fleetq.submit(
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
    SELECT * INTO v_op FROM fleetq.operations WHERE project = p_project AND name = p_operation;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'project % does not allow operation %', p_project, p_operation
            USING ERRCODE = 'FQ002';
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

-- ---------------------------------------------------------------------------------------
-- Claim

CREATE FUNCTION fleetq.claim(p_runner text, p_lane text, p_limit integer, p_claim_id uuid)
RETURNS TABLE (
    job_id bigint, lease_version bigint, lease_expires_at timestamptz, project text,
    operation text, commit_sha text, requested_node text, payload jsonb, task_id text,
    timeout_s integer, memory_mb integer, cpu_millis integer, priority_class smallint,
    reassign_count integer, lost_count smallint
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r fleetq.runners%ROWTYPE;
    l fleetq.runner_lanes%ROWTYPE;
    v_free_memory integer;
    v_free_cpu integer;
    v_offline boolean;
    v_lease interval := fleetq.setting_seconds('lease_seconds');
BEGIN
    -- A retried claim (its reply was lost after commit) gets back what it took, instead
    -- of leaving those jobs stranded until their lease expires.
    IF EXISTS (SELECT 1 FROM fleetq.jobs j
               WHERE j.claim_id = p_claim_id AND j.state IN ('claimed', 'running')) THEN
        RETURN QUERY
        SELECT j.id, j.lease_version, j.lease_expires_at, j.project, j.operation, j.commit_sha,
               j.requested_node, j.payload, j.task_id, j.timeout_s, j.memory_mb, j.cpu_millis,
               j.priority_class, j.reassign_count, j.lost_count
        FROM fleetq.jobs j
        WHERE j.claim_id = p_claim_id AND j.lease_owner = p_runner
          AND j.state IN ('claimed', 'running')
        ORDER BY j.priority_class, j.created_at, j.id;
        RETURN;
    END IF;

    -- Claims of one runner serialize on its row, so the free capacity read here is still
    -- free when the reservation below is written.
    SELECT * INTO r FROM fleetq.runners WHERE id = p_runner FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown runner %', p_runner USING ERRCODE = 'FQ004';
    END IF;
    SELECT * INTO l FROM fleetq.runner_lanes WHERE runner_id = p_runner AND lane = p_lane;
    v_free_memory := r.memory_mb - r.reserved_memory_mb;
    v_free_cpu := r.cpu_millis - r.reserved_cpu_millis;
    v_offline := fleetq.runner_is_stale(r.last_heartbeat_at);

    RETURN QUERY
    WITH candidates AS (
        -- Eligible queued jobs in priority order: an index scan on jobs_queued that stops
        -- at the limit. SKIP LOCKED: a row another claimer holds is skipped, not waited
        -- for, so an empty answer does not prove the queue is empty.
        SELECT j.id, j.memory_mb, j.cpu_millis, j.priority_class, j.created_at
        FROM fleetq.jobs j
        WHERE j.state = 'queued' AND j.lane = p_lane
          AND fleetq.eligible(j.capabilities, j.requested_node, j.memory_mb, j.cpu_millis,
                              r.node, r.capabilities, r.state, v_offline, v_free_memory,
                              v_free_cpu, l.slots, l.slots_used)
        ORDER BY j.priority_class, j.created_at, j.id
        LIMIT least(p_limit, coalesce(l.slots - l.slots_used, 0))
        FOR UPDATE SKIP LOCKED
    ),
    fitting AS (
        -- Each candidate fits alone; together only a prefix may: keep the prefix whose
        -- running totals fit, so the batch never over-reserves.
        SELECT c.id,
               sum(c.memory_mb) OVER w AS memory_total,
               sum(c.cpu_millis) OVER w AS cpu_total
        FROM candidates c
        WINDOW w AS (ORDER BY c.priority_class, c.created_at, c.id)
    ),
    taken AS (
        UPDATE fleetq.jobs j
        SET state = 'claimed',
            lease_owner = p_runner,
            reserved_on = p_runner,
            lease_version = j.lease_version + 1,
            lease_expires_at = clock_timestamp() + v_lease,
            claim_id = p_claim_id,
            claimed_at = clock_timestamp(),
            updated_at = clock_timestamp()
        FROM fitting f
        WHERE j.id = f.id AND f.memory_total <= v_free_memory AND f.cpu_total <= v_free_cpu
        RETURNING j.*
    ),
    reserve_runner AS (
        UPDATE fleetq.runners rr
        SET reserved_memory_mb = rr.reserved_memory_mb + t.memory,
            reserved_cpu_millis = rr.reserved_cpu_millis + t.cpu
        FROM (SELECT sum(taken.memory_mb)::integer AS memory, sum(taken.cpu_millis)::integer AS cpu,
                     count(*) AS n
              FROM taken) t
        WHERE rr.id = p_runner AND t.n > 0
    ),
    reserve_slots AS (
        UPDATE fleetq.runner_lanes rl
        SET slots_used = rl.slots_used + t.n
        FROM (SELECT count(*)::integer AS n FROM taken) t
        WHERE rl.runner_id = p_runner AND rl.lane = p_lane AND t.n > 0
    ),
    logged AS (
        INSERT INTO fleetq.events (kind, job_id, runner_id, lease_version)
        SELECT 'claimed', t.id, p_runner, t.lease_version FROM taken t
    )
    SELECT t.id, t.lease_version, t.lease_expires_at, t.project, t.operation, t.commit_sha,
           t.requested_node, t.payload, t.task_id, t.timeout_s, t.memory_mb, t.cpu_millis,
           t.priority_class, t.reassign_count, t.lost_count
    FROM taken t
    ORDER BY t.priority_class, t.created_at, t.id;

    IF FOUND THEN
        PERFORM pg_notify('fleetq_events', '');
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------------------
-- Fenced writes by the lease holder. Each answers per job: 'ok', 'already' (this same
-- write committed before; its reply was lost) or 'stale' (the lease moved on).

-- Count stale writes against the runner and record them, so operators see zombies.
CREATE FUNCTION fleetq.note_stale(p_runner text, p_kind text, p_jobs bigint[], p_versions bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(cardinality(p_jobs), 0) = 0 THEN
        RETURN;
    END IF;
    UPDATE fleetq.runners SET stale_rejections = stale_rejections + cardinality(p_jobs)
    WHERE id = p_runner;
    PERFORM fleetq.log_events('stale_rejected', p_jobs, p_runner, p_versions, NULL,
                              jsonb_build_object('write', p_kind));
END;
$$;

CREATE FUNCTION fleetq.heartbeat(p_runner text, p_jobs bigint[], p_versions bigint[])
RETURNS TABLE (job_id bigint, status text, lease_expires_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_ids bigint[];
    v_expiry timestamptz[];
    v_stale bigint[];
    v_stale_versions bigint[];
    v_lease interval := fleetq.setting_seconds('lease_seconds');
BEGIN
    PERFORM 1 FROM fleetq.jobs j WHERE j.id = ANY (p_jobs) ORDER BY j.id FOR UPDATE;
    WITH renewed AS (
        UPDATE fleetq.jobs j
        SET lease_expires_at = clock_timestamp() + v_lease
        FROM unnest(p_jobs, p_versions) AS i(id, version)
        WHERE j.id = i.id AND j.lease_owner = p_runner AND j.lease_version = i.version
          AND j.state IN ('claimed', 'running')
        RETURNING j.id, j.lease_expires_at
    )
    SELECT array_agg(renewed.id), array_agg(renewed.lease_expires_at) INTO v_ids, v_expiry
    FROM renewed;

    SELECT array_agg(i.id), array_agg(i.version) INTO v_stale, v_stale_versions
    FROM unnest(p_jobs, p_versions) AS i(id, version)
    WHERE i.id <> ALL (coalesce(v_ids, '{}'));
    PERFORM fleetq.note_stale(p_runner, 'heartbeat', v_stale, v_stale_versions);

    -- The runner is alive; a draining runner with nothing left is drained.
    UPDATE fleetq.runners r
    SET last_heartbeat_at = clock_timestamp(),
        state = CASE WHEN r.state = 'draining' AND NOT EXISTS
                         (SELECT 1 FROM fleetq.jobs j WHERE j.reserved_on = p_runner)
                     THEN 'drained' ELSE r.state END,
        state_changed_at = CASE WHEN r.state = 'draining' AND NOT EXISTS
                         (SELECT 1 FROM fleetq.jobs j WHERE j.reserved_on = p_runner)
                     THEN clock_timestamp() ELSE r.state_changed_at END
    WHERE r.id = p_runner;

    RETURN QUERY
    SELECT i.id,
           CASE WHEN e.id IS NULL THEN 'stale' ELSE 'ok' END,
           e.expiry
    FROM unnest(p_jobs) WITH ORDINALITY AS i(id, n)
    LEFT JOIN unnest(v_ids, v_expiry) AS e(id, expiry) ON e.id = i.id
    ORDER BY i.n;
END;
$$;

CREATE FUNCTION fleetq.report_start(
    p_runner text, p_job bigint, p_version bigint, p_node text, p_run_id uuid, p_pid integer,
    p_process_started_at timestamptz, p_prepare_ms integer
) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE fleetq.jobs
    SET state = 'running', started_at = clock_timestamp(), updated_at = clock_timestamp(),
        lease_expires_at = clock_timestamp() + fleetq.setting_seconds('lease_seconds')
    WHERE id = p_job AND lease_owner = p_runner AND lease_version = p_version AND state = 'claimed';
    IF FOUND THEN
        INSERT INTO fleetq.executions
            (job_id, lease_version, runner_id, node, run_id, pid, process_started_at,
             prepared_at, launched_at, start_reported_at, prepare_ms)
        VALUES
            (p_job, p_version, p_runner, p_node, p_run_id, p_pid, p_process_started_at,
             clock_timestamp(), coalesce(p_process_started_at, clock_timestamp()),
             clock_timestamp(), p_prepare_ms);
        PERFORM fleetq.log_events('started', ARRAY[p_job], p_runner, ARRAY[p_version], NULL,
                                  jsonb_build_object('run_id', p_run_id, 'pid', p_pid,
                                                     'node', p_node));
        RETURN 'ok';
    END IF;
    IF EXISTS (SELECT 1 FROM fleetq.executions
               WHERE job_id = p_job AND lease_version = p_version AND runner_id = p_runner
                 AND run_id = p_run_id) THEN
        RETURN 'already';
    END IF;
    PERFORM fleetq.note_stale(p_runner, 'start', ARRAY[p_job], ARRAY[p_version]);
    RETURN 'stale';
END;
$$;

-- Outcomes of many jobs of one runner in one round trip. p_outcomes: succeeded, failed,
-- refused (the job could not be prepared, e.g. an unknown commit).
CREATE FUNCTION fleetq.complete(
    p_runner text, p_jobs bigint[], p_versions bigint[], p_outcomes text[],
    p_exit_codes integer[], p_reasons text[], p_log_tails text[], p_prepare_ms integer[],
    p_run_ms integer[]
) RETURNS TABLE (job_id bigint, status text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_done bigint[];
    v_lanes text[];
    v_memory integer[];
    v_cpu integer[];
    v_versions bigint[];
    v_stale bigint[];
    v_stale_versions bigint[];
    v_already bigint[];
    v_ids bigint[];
    v_codes integer[];
    v_tails text[];
    v_prepare integer[];
    v_run integer[];
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_outcomes) o WHERE o NOT IN ('succeeded', 'failed', 'refused')) THEN
        RAISE EXCEPTION 'an outcome is succeeded, failed or refused' USING ERRCODE = 'FQ003';
    END IF;
    PERFORM 1 FROM fleetq.jobs j WHERE j.id = ANY (p_jobs) ORDER BY j.id FOR UPDATE;

    WITH input AS (
        SELECT * FROM unnest(p_jobs, p_versions, p_outcomes, p_reasons)
                 AS i(id, version, outcome, reason)
    ),
    done AS (
        UPDATE fleetq.jobs j
        SET state = i.outcome,
            failure_reason = CASE WHEN i.outcome = 'succeeded' THEN NULL
                                  ELSE coalesce(i.reason, 'exit') END,
            finished_at = clock_timestamp(),
            updated_at = clock_timestamp(),
            lease_owner = NULL,
            lease_expires_at = NULL,
            reserved_on = NULL,
            released_by = p_runner,
            released_version = i.version,
            released_kind = 'outcome'
        FROM input i
        WHERE j.id = i.id AND j.lease_owner = p_runner AND j.lease_version = i.version
          AND j.state IN ('claimed', 'running')
        RETURNING j.id, j.lane, j.memory_mb, j.cpu_millis, j.lease_version, j.state
    )
    SELECT array_agg(d.id), array_agg(d.lane), array_agg(d.memory_mb), array_agg(d.cpu_millis),
           array_agg(d.lease_version)
    INTO v_done, v_lanes, v_memory, v_cpu, v_versions
    FROM done d;

    IF v_done IS NOT NULL THEN
        -- a live lease held its owner's capacity (CHECK on jobs): give it back
        PERFORM fleetq.give_back(array_fill(p_runner, ARRAY[cardinality(v_done)]), v_lanes,
                                 v_memory, v_cpu);
        UPDATE fleetq.executions e
        SET ended_at = coalesce(e.ended_at, clock_timestamp()), exit_code = i.exit_code,
            run_ms = i.run_ms
        FROM unnest(p_jobs, p_versions, p_exit_codes, p_run_ms) AS i(id, version, exit_code, run_ms)
        WHERE e.job_id = i.id AND e.lease_version = i.version AND i.id = ANY (v_done);
        SELECT array_agg(i.id ORDER BY i.n), array_agg(i.c ORDER BY i.n),
               array_agg(i.t ORDER BY i.n), array_agg(i.p ORDER BY i.n), array_agg(i.r ORDER BY i.n)
        INTO v_ids, v_codes, v_tails, v_prepare, v_run
        FROM unnest(p_jobs, p_exit_codes, p_log_tails, p_prepare_ms, p_run_ms)
             WITH ORDINALITY AS i(id, c, t, p, r, n)
        WHERE i.id = ANY (v_done);
        PERFORM fleetq.record_outcomes(v_ids, v_codes, v_tails, v_prepare, v_run);
        INSERT INTO fleetq.events (kind, job_id, runner_id, lease_version, detail)
        SELECT j.state, j.id, p_runner, j.lease_version,
               jsonb_build_object('exit_code', i.exit_code, 'reason', j.failure_reason)
        FROM fleetq.jobs j
        JOIN unnest(p_jobs, p_exit_codes) AS i(id, exit_code) ON i.id = j.id
        WHERE j.id = ANY (v_done);
        PERFORM pg_notify('fleetq_events', '');
    END IF;

    -- Not done: either this same outcome committed earlier (reply lost), or stale.
    -- The usual batch is all done: answer it without reading anything more.
    IF coalesce(cardinality(v_done), 0) = cardinality(p_jobs) THEN
        RETURN QUERY SELECT i.id, 'ok'::text FROM unnest(p_jobs) WITH ORDINALITY AS i(id, n)
                     ORDER BY i.n;
        RETURN;
    END IF;
    SELECT array_agg(j.id) INTO v_already
    FROM fleetq.jobs j
    JOIN unnest(p_jobs, p_versions) AS i(id, version) ON i.id = j.id
    WHERE j.id <> ALL (coalesce(v_done, '{}'))
      AND j.released_by = p_runner AND j.released_version = i.version
      AND j.lease_version = i.version AND j.released_kind = 'outcome';
    SELECT array_agg(i.id), array_agg(i.version) INTO v_stale, v_stale_versions
    FROM unnest(p_jobs, p_versions) AS i(id, version)
    WHERE i.id <> ALL (coalesce(v_done, '{}')) AND i.id <> ALL (coalesce(v_already, '{}'));
    PERFORM fleetq.note_stale(p_runner, 'outcome', v_stale, v_stale_versions);

    RETURN QUERY
    SELECT i.id,
           CASE WHEN i.id = ANY (coalesce(v_done, '{}')) THEN 'ok'
                WHEN i.id = ANY (coalesce(v_already, '{}')) THEN 'already'
                ELSE 'stale' END
    FROM unnest(p_jobs) WITH ORDINALITY AS i(id, n)
    ORDER BY i.n;
END;
$$;

-- The fence of a runner handing a lease back (a loss report, a release): NULL when the
-- caller holds (job, version) live, with the row now locked in its transaction; else
-- 'already' (this same hand-back committed before and no newer claim happened since)
-- or 'stale' (counted against the runner).
CREATE FUNCTION fleetq.hand_back_guard(p_runner text, p_job bigint, p_version bigint, p_kind text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    j fleetq.jobs%ROWTYPE;
BEGIN
    SELECT * INTO j FROM fleetq.jobs WHERE id = p_job FOR UPDATE;
    IF FOUND AND j.lease_owner = p_runner AND j.lease_version = p_version
       AND j.state IN ('claimed', 'running') THEN
        RETURN NULL;
    END IF;
    IF FOUND AND j.released_by = p_runner AND j.released_version = p_version
       AND j.lease_version = p_version AND j.released_kind = p_kind THEN
        RETURN 'already';
    END IF;
    PERFORM fleetq.note_stale(p_runner, p_kind, ARRAY[p_job], ARRAY[p_version]);
    RETURN 'stale';
END;
$$;

-- An explicit loss (DESIGN §1.5): the first requeues, the second fails with reason 'lost'.
-- Lease expiry is a different path (reap) and never touches lost_count.
CREATE FUNCTION fleetq.report_lost(p_runner text, p_job bigint, p_version bigint, p_reason text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    j fleetq.jobs%ROWTYPE;
    v_requeue boolean;
    v_answer text;
BEGIN
    v_answer := fleetq.hand_back_guard(p_runner, p_job, p_version, 'lost');
    IF v_answer IS NOT NULL THEN
        RETURN v_answer;
    END IF;
    SELECT * INTO j FROM fleetq.jobs WHERE id = p_job;
    v_requeue := j.lost_count = 0;
    UPDATE fleetq.jobs
    SET state = CASE WHEN v_requeue THEN 'queued' ELSE 'failed' END,
        failure_reason = CASE WHEN v_requeue THEN NULL ELSE 'lost' END,
        finished_at = CASE WHEN v_requeue THEN NULL ELSE clock_timestamp() END,
        lost_count = lost_count + 1,
        lease_owner = NULL, lease_expires_at = NULL, reserved_on = NULL, claim_id = NULL,
        released_by = p_runner, released_version = p_version, released_kind = 'lost',
        updated_at = clock_timestamp()
    WHERE id = p_job;
    PERFORM fleetq.give_back(ARRAY[p_runner], ARRAY[j.lane], ARRAY[j.memory_mb], ARRAY[j.cpu_millis]);
    UPDATE fleetq.executions
    SET ended_at = clock_timestamp(), stop_reason = 'lost'
    WHERE job_id = p_job AND lease_version = p_version AND ended_at IS NULL;
    PERFORM fleetq.log_events('lost', ARRAY[p_job], p_runner, ARRAY[p_version], NULL,
                              jsonb_build_object('reason', p_reason, 'requeued', v_requeue));
    IF v_requeue THEN
        PERFORM pg_notify('fleetq_work', j.lane);
        RETURN 'requeued';
    END IF;
    PERFORM fleetq.record_outcomes(ARRAY[p_job], ARRAY[NULL::integer], ARRAY[NULL::text],
                                   ARRAY[NULL::integer], ARRAY[NULL::integer]);
    PERFORM fleetq.log_events('failed', ARRAY[p_job], p_runner, ARRAY[p_version], NULL,
                              '{"reason": "lost"}');
    RETURN 'failed';
END;
$$;

-- A runner hands a lease back on purpose (graceful shutdown after its grace period):
-- the job is requeued at once, counting neither as a loss nor as a reassignment.
CREATE FUNCTION fleetq.release(p_runner text, p_job bigint, p_version bigint, p_reason text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    j fleetq.jobs%ROWTYPE;
    v_answer text;
BEGIN
    v_answer := fleetq.hand_back_guard(p_runner, p_job, p_version, 'release');
    IF v_answer IS NOT NULL THEN
        RETURN v_answer;
    END IF;
    SELECT * INTO j FROM fleetq.jobs WHERE id = p_job;
    UPDATE fleetq.jobs
    SET state = 'queued', lease_owner = NULL, lease_expires_at = NULL, reserved_on = NULL,
        claim_id = NULL, released_by = p_runner, released_version = p_version,
        released_kind = 'release', updated_at = clock_timestamp()
    WHERE id = p_job;
    PERFORM fleetq.give_back(ARRAY[p_runner], ARRAY[j.lane], ARRAY[j.memory_mb], ARRAY[j.cpu_millis]);
    UPDATE fleetq.executions
    SET ended_at = coalesce(ended_at, clock_timestamp()),
        stop_reason = coalesce(stop_reason, 'shutdown'), stop_confirmed = true
    WHERE job_id = p_job AND lease_version = p_version;
    PERFORM fleetq.log_events('released', ARRAY[p_job], p_runner, ARRAY[p_version], NULL,
                              jsonb_build_object('reason', p_reason));
    PERFORM pg_notify('fleetq_work', j.lane);
    RETURN 'ok';
END;
$$;

-- A runner confirms that an execution it was asked to stop is gone (cancelled or
-- superseded). This ends "stop pending" and gives back a cancelled job's capacity.
CREATE FUNCTION fleetq.confirm_stop(
    p_runner text, p_job bigint, p_version bigint, p_signal integer, p_reason text
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    j fleetq.jobs%ROWTYPE;
BEGIN
    SELECT * INTO j FROM fleetq.jobs WHERE id = p_job FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown job %', p_job USING ERRCODE = 'FQ004';
    END IF;
    UPDATE fleetq.executions
    SET ended_at = coalesce(ended_at, clock_timestamp()), signal = p_signal,
        stop_reason = p_reason, stop_confirmed = true
    WHERE job_id = p_job AND lease_version = p_version AND runner_id = p_runner;
    IF j.state = 'cancelled' AND j.reserved_on = p_runner AND j.lease_version = p_version THEN
        UPDATE fleetq.jobs SET reserved_on = NULL, updated_at = clock_timestamp() WHERE id = p_job;
        PERFORM fleetq.give_back(ARRAY[p_runner], ARRAY[j.lane], ARRAY[j.memory_mb],
                                 ARRAY[j.cpu_millis]);
    END IF;
    PERFORM fleetq.log_events('stopped', ARRAY[p_job], p_runner, ARRAY[p_version], NULL,
                              jsonb_build_object('reason', p_reason, 'signal', p_signal));
    RETURN 'ok';
END;
$$;

-- ---------------------------------------------------------------------------------------
-- Operator and maintenance transitions

CREATE FUNCTION fleetq.cancel(p_job bigint, p_actor text, p_reason text)
RETURNS TABLE (job_id bigint, previous_state text, state text, stop_pending boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    j fleetq.jobs%ROWTYPE;
    v_live boolean;
BEGIN
    SELECT * INTO j FROM fleetq.jobs WHERE id = p_job FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown job %', p_job USING ERRCODE = 'FQ004';
    END IF;
    IF j.state NOT IN ('queued', 'claimed', 'running') THEN
        RETURN QUERY SELECT j.id, j.state, j.state, false;  -- already terminal: nothing to do
        RETURN;
    END IF;
    v_live := j.state <> 'queued';
    -- Terminal at once (DESIGN §1.7); the lease ends, so any write by the old owner is
    -- stale from here on, but the capacity stays reserved until the runner confirms the
    -- stop: cancellation is not a stop.
    UPDATE fleetq.jobs
    SET state = 'cancelled', finished_at = clock_timestamp(), updated_at = clock_timestamp(),
        cancel_requested_at = clock_timestamp(), cancelled_by = p_actor, cancel_reason = p_reason,
        lease_owner = NULL, lease_expires_at = NULL
    WHERE id = p_job;
    UPDATE fleetq.executions SET stop_requested_at = clock_timestamp()
    WHERE job_id = p_job AND lease_version = j.lease_version AND ended_at IS NULL;
    PERFORM fleetq.record_outcomes(ARRAY[p_job], ARRAY[NULL::integer], ARRAY[NULL::text],
                                   ARRAY[NULL::integer], ARRAY[NULL::integer]);
    PERFORM fleetq.log_events('cancelled', ARRAY[p_job], j.lease_owner, ARRAY[j.lease_version],
                              p_actor, jsonb_build_object('reason', p_reason, 'stop_pending', v_live));
    IF v_live THEN
        PERFORM pg_notify('fleetq_control', 'job:' || p_job);
    END IF;
    RETURN QUERY SELECT j.id, j.state, 'cancelled'::text, v_live;
END;
$$;

-- Return expired leases to the queue (DESIGN §4). One leader at a time: a caller that
-- does not get the advisory lock does nothing, so any runner or fleetq process can host
-- the reaper. p_now lets tests move time forward without sleeping.
CREATE FUNCTION fleetq.reap(p_limit integer DEFAULT 1000, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (requeued integer, failed integer, leader boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_cap integer := fleetq.setting_int('reassignment_cap');
    v_ids bigint[];
    v_versions bigint[];
    v_owners text[];
    v_lanes text[];
    v_memory integer[];
    v_cpu integer[];
    v_failed bigint[];
    v_failed_versions bigint[];
BEGIN
    IF NOT pg_try_advisory_xact_lock(7365657071) THEN  -- "reaper": one leader per moment
        RETURN QUERY SELECT 0, 0, false;
        RETURN;
    END IF;
    WITH expired AS (
        SELECT j.id, j.reserved_on
        FROM fleetq.jobs j
        WHERE j.state IN ('claimed', 'running')
          AND j.lease_expires_at < coalesce(p_now, clock_timestamp())
        ORDER BY j.lease_expires_at, j.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ),
    moved AS (
        UPDATE fleetq.jobs j
        SET state = CASE WHEN j.reassign_count + 1 > v_cap THEN 'failed' ELSE 'queued' END,
            failure_reason = CASE WHEN j.reassign_count + 1 > v_cap
                                  THEN 'reassignments_exhausted' END,
            finished_at = CASE WHEN j.reassign_count + 1 > v_cap THEN clock_timestamp() END,
            reassign_count = j.reassign_count + 1,
            lease_owner = NULL, lease_expires_at = NULL, reserved_on = NULL, claim_id = NULL,
            updated_at = clock_timestamp()
        FROM expired e
        WHERE j.id = e.id
        RETURNING j.id, j.lease_version, e.reserved_on, j.lane, j.memory_mb, j.cpu_millis, j.state
    )
    SELECT array_agg(m.id ORDER BY m.id), array_agg(m.lease_version ORDER BY m.id),
           array_agg(m.reserved_on ORDER BY m.id), array_agg(m.lane ORDER BY m.id),
           array_agg(m.memory_mb ORDER BY m.id), array_agg(m.cpu_millis ORDER BY m.id),
           array_agg(m.id ORDER BY m.id) FILTER (WHERE m.state = 'failed'),
           array_agg(m.lease_version ORDER BY m.id) FILTER (WHERE m.state = 'failed')
    INTO v_ids, v_versions, v_owners, v_lanes, v_memory, v_cpu, v_failed, v_failed_versions
    FROM moved m;

    IF v_ids IS NULL THEN
        RETURN QUERY SELECT 0, 0, true;
        RETURN;
    END IF;
    PERFORM fleetq.give_back(v_owners, v_lanes, v_memory, v_cpu);
    INSERT INTO fleetq.events (kind, job_id, runner_id, lease_version, detail)
    SELECT 'lease_expired', t.id, t.owner, t.version,
           jsonb_build_object('requeued', NOT (t.id = ANY (coalesce(v_failed, '{}'))))
    FROM unnest(v_ids, v_owners, v_versions) AS t(id, owner, version);
    IF v_failed IS NOT NULL THEN
        PERFORM fleetq.record_outcomes(
            v_failed, array_fill(NULL::integer, ARRAY[cardinality(v_failed)]),
            array_fill(NULL::text, ARRAY[cardinality(v_failed)]),
            array_fill(NULL::integer, ARRAY[cardinality(v_failed)]),
            array_fill(NULL::integer, ARRAY[cardinality(v_failed)]));
        PERFORM fleetq.log_events('failed', v_failed, NULL, v_failed_versions, NULL,
                                  '{"reason": "reassignments_exhausted"}');
    END IF;
    PERFORM pg_notify('fleetq_events', '');
    PERFORM pg_notify('fleetq_work', lane) FROM (SELECT DISTINCT unnest(v_lanes) AS lane) l;
    RETURN QUERY SELECT cardinality(v_ids) - coalesce(cardinality(v_failed), 0),
                        coalesce(cardinality(v_failed), 0), true;
END;
$$;

-- ---------------------------------------------------------------------------------------
-- Runners

-- Register (or re-register after a restart: the id node/name is stable) a runner.
-- Reservations are recomputed from the jobs it holds, so a restart heals any drift.
CREATE FUNCTION fleetq.register_runner(
    p_node text, p_name text, p_capabilities text[], p_memory_mb integer,
    p_cpu_millis integer, p_lanes text[], p_slots integer[], p_version text, p_pid integer
) RETURNS SETOF fleetq.runners
LANGUAGE plpgsql AS $$
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
$$;

-- Operator (and runner shutdown) state changes: drain, pause, resume, offline.
CREATE FUNCTION fleetq.set_runner_state(p_runner text, p_state text, p_reason text, p_actor text)
RETURNS SETOF fleetq.runners
LANGUAGE plpgsql AS $$
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
$$;

-- ---------------------------------------------------------------------------------------
-- The fenced ledger (DESIGN §1.3): a resource that rejects a token lower than the
-- highest it has seen for a key. Equal tokens pass: the same holder may write twice.

CREATE FUNCTION fleetq.fenced_write(p_key text, p_job bigint, p_token bigint, p_value jsonb)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_accepted boolean;
BEGIN
    INSERT INTO fleetq.fenced_ledger AS f (key, highest_token, job_id, value)
    VALUES (p_key, p_token, p_job, coalesce(p_value, '{}'))
    ON CONFLICT (key) DO UPDATE SET
        highest_token = EXCLUDED.highest_token, job_id = EXCLUDED.job_id,
        value = EXCLUDED.value, updated_at = clock_timestamp()
    WHERE f.highest_token <= EXCLUDED.highest_token
    RETURNING true INTO v_accepted;
    v_accepted := coalesce(v_accepted, false);
    INSERT INTO fleetq.fenced_writes (key, job_id, token, value, accepted)
    VALUES (p_key, p_job, p_token, coalesce(p_value, '{}'), v_accepted);
    RETURN v_accepted;
END;
$$;
