-- Protocol: Submit (validated against the operation's requirements, idempotent by key) and
-- retiring an operation.
--
-- Applied by `fleetq migrate` whenever this file changes (CREATE OR REPLACE; every
-- changed protocol file in one transaction). Change a function here; tables, dropped
-- functions and new signatures go in a numbered migration.

-- Submit as before, but the operation is read under the same KEY SHARE lock the job's
-- foreign key takes anyway (no extra cost), and a retired operation is refused. The
-- lock orders a submit against a removal (which locks the row FOR UPDATE): a submit in
-- flight finishes first and its job counts as live for the removal; a later submit sees
-- the operation retired.
CREATE OR REPLACE FUNCTION fleetq.submit_unchecked(p_project text, p_operation text, p_commit text, p_requested_node text, p_idempotency_key text, p_task_id text, p_submitted_by text, p_payload jsonb, p_after bigint[] DEFAULT NULL, p_traceparent text DEFAULT NULL)
 RETURNS TABLE(job_id bigint, created boolean, state text, priority_class smallint)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_gate boolean;
    v_op fleetq.operations%ROWTYPE;
    v_class smallint;
    v_id bigint;
    v_old fleetq.jobs%ROWTYPE;
    v_limit integer := fleetq.setting_int('max_payload_bytes');
    v_after bigint[] := ARRAY(SELECT DISTINCT a FROM unnest(p_after) AS a WHERE a IS NOT NULL
                              ORDER BY a);
    v_unknown bigint[];
    v_waiting boolean := false;
    v_failed_id bigint;
    v_failed_state text;
    v_problem text;
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
    v_problem := fleetq.payload_problem(coalesce(p_payload, '{}'), v_limit);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION '%', v_problem USING ERRCODE = 'FQ003';
    END IF;
    PERFORM fleetq.refuse_bad_text(p_requested_node, 'requested node');
    PERFORM fleetq.refuse_bad_text(p_idempotency_key, 'idempotency key');
    PERFORM fleetq.refuse_bad_text(p_task_id, 'task id');
    PERFORM fleetq.refuse_bad_text(p_submitted_by, 'submitting identity');
    IF fleetq.bad_traceparent(p_traceparent) THEN
        RAISE EXCEPTION 'traceparent is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)'
            USING ERRCODE = 'FQ003';
    END IF;
    IF cardinality(v_after) > 0 THEN
        PERFORM fleetq.require_read_committed('a submit with dependencies');
        SELECT array_agg(a) INTO v_unknown FROM unnest(v_after) AS a
        WHERE NOT EXISTS (SELECT 1 FROM fleetq.jobs j WHERE j.id = a);
        IF v_unknown IS NOT NULL THEN
            -- a reference to nothing, like an unknown project (exit 65, HTTP 422)
            RAISE EXCEPTION 'no job % to wait for', array_to_string(v_unknown, ', ')
                USING ERRCODE = 'FQ002';
        END IF;
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
         requested_node, idempotency_key, task_id, submitted_by, payload, priority_class, state,
         traceparent)
    VALUES
        (p_project, p_operation, p_commit, v_op.lane, v_op.capabilities, v_op.memory_mb,
         v_op.cpu_millis, v_op.timeout_s, p_requested_node, p_idempotency_key, p_task_id,
         p_submitted_by, coalesce(p_payload, '{}'), v_class,
         CASE WHEN cardinality(v_after) > 0 THEN 'waiting' ELSE 'queued' END, p_traceparent)
    ON CONFLICT (project, submitted_by, idempotency_key) WHERE idempotency_key IS NOT NULL
    DO NOTHING
    RETURNING id INTO v_id;

    IF v_id IS NOT NULL AND cardinality(v_after) > 0 THEN
        -- The dependencies are recorded first and their states read after: the foreign
        -- keys hold each dependency (KEY SHARE) from here to commit, so one that ends
        -- now either ended before this statement and is read below, or cannot take its
        -- row FOR UPDATE while this submit is open and is settled again once it can
        -- (settle_dependents, fleetq.settle_again): an ending never waits for a submit.
        INSERT INTO fleetq.job_dependencies (job_id, depends_on)
        SELECT v_id, a FROM unnest(v_after) AS a;
        SELECT j.id, j.state INTO v_failed_id, v_failed_state FROM fleetq.jobs j
        WHERE j.id = ANY (v_after) AND j.state IN ('failed', 'refused', 'cancelled')
        ORDER BY j.id LIMIT 1;
        v_waiting := EXISTS (SELECT 1 FROM fleetq.jobs j
                             WHERE j.id = ANY (v_after) AND j.state <> 'succeeded');
        IF NOT v_waiting THEN
            UPDATE fleetq.jobs SET state = 'queued' WHERE id = v_id;
        END IF;
    END IF;

    IF v_id IS NOT NULL THEN
        PERFORM fleetq.log_events('submitted', ARRAY[v_id], NULL, ARRAY[0::bigint], p_submitted_by,
                                  jsonb_build_object('priority_class', v_class)
                                  || jsonb_strip_nulls(jsonb_build_object('traceparent', p_traceparent))
                                  || CASE WHEN cardinality(v_after) > 0
                                          THEN jsonb_build_object('after', to_jsonb(v_after))
                                          ELSE '{}'::jsonb END);
        IF v_failed_id IS NOT NULL THEN  -- a dependency already failed: cancelled at once
            PERFORM fleetq.cancel_unchecked(
                v_id, 'fleetq', format('dependency failed: job %s %s', v_failed_id, v_failed_state));
            RETURN QUERY SELECT v_id, true, 'cancelled'::text, v_class;
            RETURN;
        END IF;
        IF NOT v_waiting THEN
            PERFORM fleetq.announce_job(v_id);
        END IF;
        RETURN QUERY SELECT v_id, true, CASE WHEN v_waiting THEN 'waiting' ELSE 'queued' END, v_class;
        RETURN;
    END IF;

    -- The key exists. This is a second statement on purpose: it takes a new snapshot, so
    -- it sees a job that a concurrent submit committed while the INSERT above waited.
    SELECT * INTO v_old FROM fleetq.jobs j
    WHERE j.project = p_project AND j.submitted_by = p_submitted_by
      AND j.idempotency_key = p_idempotency_key;
    -- Everything that defines the job is compared, its dependencies too (a repeat with
    -- other `after` jobs is another request). Not the traceparent: a retry is sent from
    -- a span (or a pipeline) of its own, and it is still the same job.
    IF (v_old.operation, v_old.commit_sha, v_old.requested_node, v_old.task_id,
        v_old.submitted_by, v_old.payload)
       IS DISTINCT FROM
       (p_operation, p_commit, p_requested_node, p_task_id, p_submitted_by,
        coalesce(p_payload, '{}'::jsonb))
       OR v_after IS DISTINCT FROM ARRAY(SELECT d.depends_on FROM fleetq.job_dependencies d
                                        WHERE d.job_id = v_old.id ORDER BY 1) THEN
        RAISE EXCEPTION 'idempotency key already names job % of project % with other parameters',
            v_old.id, p_project USING ERRCODE = 'FQ001';
    END IF;
    RETURN QUERY SELECT v_old.id, false, v_old.state, v_old.priority_class;
END;
$function$;

-- ---------------------------------------------------------------------------------------
-- Submitting and cancelling: the identity is the caller's, never chosen.
CREATE OR REPLACE FUNCTION fleetq.submit(p_project text, p_operation text, p_commit text, p_requested_node text, p_idempotency_key text, p_task_id text, p_submitted_by text, p_payload jsonb, p_after bigint[] DEFAULT NULL, p_traceparent text DEFAULT NULL)
 RETURNS TABLE(job_id bigint, created boolean, state text, priority_class smallint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['submitter', 'operator']);
    RETURN QUERY SELECT * FROM fleetq.submit_unchecked(
        p_project, p_operation, p_commit, p_requested_node, p_idempotency_key, p_task_id,
        CASE WHEN c.kind = 'admin' THEN p_submitted_by ELSE c.subject END, p_payload, p_after,
        p_traceparent);
END;
$function$;

-- Submit an ended job's check again (`fleetq rerun`): a new job of the same project,
-- operation, commit, node, task and payload, as the caller (a submitter reruns anyone's
-- check, as it could submit it; the new job is its own), under the operation's current
-- definition. A `rerun` event on the new job names the one it repeats. A live job is
-- refused for now: it has not decided anything to repeat yet. With a key, a repeat of
-- the rerun answers the same job.
CREATE OR REPLACE FUNCTION fleetq.rerun(p_job bigint, p_submitted_by text, p_idempotency_key text)
 RETURNS TABLE(job_id bigint, created boolean, state text, priority_class smallint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    c record;
    v_old fleetq.jobs%ROWTYPE;
    v_new record;
    v_by text;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['submitter', 'operator']);
    v_by := CASE WHEN c.kind = 'admin' THEN p_submitted_by ELSE c.subject END;
    SELECT * INTO v_old FROM fleetq.jobs j WHERE j.id = p_job;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown job %', p_job USING ERRCODE = 'FQ004';
    END IF;
    IF v_old.state IN ('waiting', 'queued', 'claimed', 'running') THEN
        RAISE EXCEPTION 'job % is still % and has decided nothing to rerun: wait for it, or '
            'cancel it first', p_job, v_old.state USING ERRCODE = 'FQ006';
    END IF;
    SELECT * INTO v_new FROM fleetq.submit_unchecked(
        v_old.project, v_old.operation, v_old.commit_sha, v_old.requested_node,
        p_idempotency_key, v_old.task_id, v_by, v_old.payload);
    IF v_new.created THEN
        PERFORM fleetq.log_events('rerun', ARRAY[v_new.job_id], NULL, ARRAY[0::bigint], v_by,
                                  jsonb_build_object('rerun_of', p_job));
    END IF;
    RETURN QUERY SELECT v_new.job_id, v_new.created, v_new.state, v_new.priority_class;
END;
$function$;

-- Retire an operation: refused while it has live jobs (queued, claimed or running), which
-- would otherwise run under a definition nobody can see any more. Removing a retired
-- operation again is a no-op; `fleetq apply` with the operation in it brings it back.
-- The configuration is the owner's (as `fleetq apply` is): no grant.
CREATE OR REPLACE FUNCTION fleetq.retire_operation(p_project text, p_operation text, p_actor text)
 RETURNS TABLE(removed boolean, retired_at timestamp with time zone, jobs bigint)
 LANGUAGE plpgsql
AS $function$
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
    SELECT count(*) FILTER (WHERE j.state IN ('waiting', 'queued', 'claimed', 'running')), count(*)
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
$function$;

-- ---------------------------------------------------------------------------------------
-- Many jobs in one statement (migration 0020): set-based, so a batch costs one INSERT of
-- jobs, one of events and one NOTIFY per lane instead of a plpgsql call per job. The
-- rules are one submit's: every job is checked before any is written (the first bad one
-- is named by its position, from 1), the class is derived, an idempotency key that
-- names an existing job answers it (created false) or refuses a different request.
-- Dependencies are not taken here (submit one by one with `after`). Answers in input
-- order. No temporary table: a caller could create one of the same name first, and this
-- runs as the schema's owner.
--
-- The batch's rows are never joined to one another: a join's plan rests on estimates,
-- and PostgreSQL's for an unnest of an array parameter is a guess (10 rows in a generic
-- plan, kept from the sixth call of a connection on; a few rows from a small table never
-- analyzed). A join of the new jobs to their input rows became a nested loop, quadratic
-- in the batch (test_query_plans.py holds it linear). The events come from the
-- insert's own rows, and which input rows made a job is found by walking the two id
-- lists, both in input order, side by side (test_query_plans.py).
CREATE OR REPLACE FUNCTION fleetq.submit_many_unchecked(p_projects text[], p_operations text[], p_commits text[], p_nodes text[], p_keys text[], p_tasks text[], p_payloads jsonb[], p_traceparents text[], p_submitted_by text)
 RETURNS TABLE(job_id bigint, created boolean, state text, priority_class smallint)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_count integer := coalesce(cardinality(p_projects), 0);
    v_limit integer := fleetq.setting_int('max_payload_bytes');
    v_verifier boolean := EXISTS (SELECT 1 FROM fleetq.identities
                                  WHERE name = p_submitted_by AND role = 'release-verification');
    v_bad record;
    v_ids_by_n bigint[];         -- the id drawn for each input row, in input order
    v_class_by_n smallint[];
    v_made_ids bigint[];         -- the jobs made, ascending (ids ascend with input order)
    v_made bigint[];             -- per input row, the job it made, or NULL
    v_lanes text[];
    v_all_new boolean;           -- every input row made a job (no key was used already)
    k integer := 1;
    v_ids regclass := pg_get_serial_sequence('fleetq.jobs', 'id');  -- looked up once
BEGIN
    -- every column one-dimensional and as long as the projects (an optional one may be
    -- NULL): unnest would pad a short one with NULLs and flatten a matrix
    IF coalesce(array_ndims(p_projects), 1) <> 1 OR cardinality(p_operations) <> v_count
       OR cardinality(p_commits) <> v_count
       OR EXISTS (SELECT 1 FROM unnest(ARRAY[array_ndims(p_operations), array_ndims(p_commits),
                                             array_ndims(p_nodes), array_ndims(p_keys),
                                             array_ndims(p_tasks), array_ndims(p_payloads),
                                             array_ndims(p_traceparents)]) AS d
                  WHERE d <> 1)
       OR EXISTS (SELECT 1 FROM unnest(ARRAY[cardinality(p_nodes), cardinality(p_keys),
                                             cardinality(p_tasks), cardinality(p_payloads),
                                             cardinality(p_traceparents)]) AS c
                  WHERE c IS NOT NULL AND c <> v_count) THEN
        RAISE EXCEPTION 'submit_many takes one-dimensional arrays of one length (% jobs)', v_count
            USING ERRCODE = 'FQ003';
    END IF;
    IF v_count = 0 THEN
        RETURN;
    END IF;
    -- the batch's operations are read under the KEY SHARE lock the jobs' foreign key
    -- takes anyway (as one submit does), so a removal in flight orders itself against it
    PERFORM 1 FROM fleetq.operations o
    WHERE (o.project, o.name) IN (SELECT DISTINCT t.p, t.op
                                  FROM unnest(p_projects, p_operations) AS t(p, op))
    ORDER BY o.project, o.name
    FOR KEY SHARE;

    -- each job's first problem (and its SQLSTATE), the first job with one named
    SELECT format('job %s: %s', c.n, c.problem) AS message, c.code INTO v_bad
    FROM (SELECT i.n,
                 CASE WHEN o.name IS NULL
                          THEN format('project %s does not allow operation %s', i.project,
                                      i.operation)
                      WHEN o.retired_at IS NOT NULL
                          THEN format('operation %s/%s was removed', i.project, i.operation)
                      WHEN i.commit_sha IS NULL OR i.commit_sha !~ '^[0-9a-f]{40}$'
                          THEN 'commit must be a full 40-character hex SHA'
                      WHEN pp.payload IS NOT NULL THEN pp.payload
                      WHEN fleetq.bad_text(i.key) OR fleetq.bad_text(i.node)
                           OR fleetq.bad_text(i.task)
                          THEN 'an idempotency key, node or task is empty, over 256 bytes or '
                               'holds control characters'
                      WHEN fleetq.bad_traceparent(i.traceparent)
                          THEN 'traceparent is not a W3C traceparent'
                 END AS problem,
                 CASE WHEN o.name IS NULL OR o.retired_at IS NOT NULL THEN 'FQ002'
                      ELSE 'FQ003' END AS code
          FROM unnest(p_projects, p_operations, p_commits, p_keys, p_payloads, p_nodes,
                      p_tasks, p_traceparents)
               WITH ORDINALITY AS i(project, operation, commit_sha, key, payload, node, task,
                                    traceparent, n)
          LEFT JOIN fleetq.operations o ON o.project = i.project AND o.name = i.operation
          CROSS JOIN LATERAL fleetq.payload_problem(coalesce(i.payload, '{}'), v_limit)
              AS pp(payload)) c
    WHERE c.problem IS NOT NULL
    ORDER BY c.n LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '%', v_bad.message USING ERRCODE = v_bad.code;
    END IF;

    -- Ids are drawn in input order (a volatile target list is computed after the sort);
    -- the rows go in ordered by key, so two batches with keys in common take their
    -- locks in one order and never deadlock. A key already used, or used earlier in the
    -- batch, makes no job (DO NOTHING).
    WITH input AS (
        SELECT i.*, o.lane, o.capabilities, o.memory_mb, o.cpu_millis, o.timeout_s,
               CASE WHEN v_verifier THEN 0 WHEN p.release_gate THEN 1 ELSE 2 END::smallint
                   AS class
        FROM unnest(p_projects, p_operations, p_commits, p_nodes, p_keys, p_tasks,
                    p_payloads, p_traceparents)
             WITH ORDINALITY AS i(project, operation, commit_sha, node, key, task, payload,
                                  traceparent, n)
        JOIN fleetq.projects p ON p.name = i.project
        JOIN fleetq.operations o ON o.project = i.project AND o.name = i.operation
    ),
    numbered AS (
        SELECT input.*, nextval(v_ids) AS id
        FROM input ORDER BY input.n
    ),
    made AS (
        INSERT INTO fleetq.jobs
            (id, project, operation, commit_sha, lane, capabilities, memory_mb, cpu_millis,
             timeout_s, requested_node, idempotency_key, task_id, submitted_by, payload,
             priority_class, state, traceparent)
        OVERRIDING SYSTEM VALUE
        SELECT nb.id, nb.project, nb.operation, nb.commit_sha, nb.lane, nb.capabilities,
               nb.memory_mb, nb.cpu_millis, nb.timeout_s, nb.node, nb.key, nb.task,
               p_submitted_by, coalesce(nb.payload, '{}'), nb.class, 'queued', nb.traceparent
        FROM numbered nb
        ORDER BY nb.project, nb.key NULLS LAST, nb.n
        ON CONFLICT (project, submitted_by, idempotency_key) WHERE idempotency_key IS NOT NULL
        DO NOTHING
        RETURNING id, lane, priority_class, traceparent
    ),
    logged AS (
        INSERT INTO fleetq.events (kind, job_id, lease_version, actor, detail)
        SELECT 'submitted', m.id, 0, p_submitted_by,
               jsonb_build_object('priority_class', m.priority_class)
               || jsonb_strip_nulls(jsonb_build_object('traceparent', m.traceparent))
        FROM made m
        ORDER BY m.id
    )
    SELECT (SELECT array_agg(nb.id ORDER BY nb.n) FROM numbered nb),
           (SELECT array_agg(nb.class ORDER BY nb.n) FROM numbered nb),
           array_agg(m.id ORDER BY m.id), array_agg(DISTINCT m.lane)
    INTO v_ids_by_n, v_class_by_n, v_made_ids, v_lanes
    FROM made m;
    v_all_new := coalesce(cardinality(v_made_ids), 0) = v_count;

    IF NOT v_all_new THEN
        v_made := array_fill(NULL::bigint, ARRAY[v_count]);
        FOR n IN 1 .. v_count LOOP
            IF v_made_ids[k] = v_ids_by_n[n] THEN
                v_made[n] := v_ids_by_n[n];
                k := k + 1;
            END IF;
        END LOOP;
        IF k <= coalesce(cardinality(v_made_ids), 0) THEN  -- the walk's premise broke
            RAISE EXCEPTION 'submit_many: job ids were not drawn in input order';
        END IF;

        -- A job not made here names an existing one by its key: the same request answers
        -- it, a different one is refused. A new statement, so a new snapshot: it sees what
        -- a concurrent submit committed while the insert waited for it.
        SELECT i.n, j.id AS existing INTO v_bad
        FROM unnest(p_projects, p_operations, p_commits, p_nodes, p_keys, p_tasks, p_payloads,
                    v_made)
             WITH ORDINALITY AS i(project, operation, commit_sha, node, key, task, payload,
                                  made, n)
        CROSS JOIN LATERAL (SELECT j.id, j.operation, j.commit_sha, j.requested_node,
                                   j.task_id, j.submitted_by, j.payload,
                                   EXISTS (SELECT 1 FROM fleetq.job_dependencies d
                                           WHERE d.job_id = j.id) AS waits
                            FROM fleetq.jobs j
                            WHERE i.made IS NULL AND j.project = i.project
                              AND j.submitted_by = p_submitted_by
                              AND j.idempotency_key = i.key
                            LIMIT 1) j  -- a probe by key per row (see the answer below)
        WHERE (j.operation, j.commit_sha, j.requested_node, j.task_id, j.submitted_by,
               j.payload, j.waits)  -- a batch's jobs wait on nothing
              IS DISTINCT FROM (i.operation, i.commit_sha, i.node, i.task, p_submitted_by,
                                coalesce(i.payload, '{}'), false)
        ORDER BY i.n LIMIT 1;
        IF FOUND AND array_position(v_made, v_bad.existing) IS NOT NULL THEN
            RAISE EXCEPTION 'job %: repeats the idempotency key of job % of this batch with '
                'other parameters', v_bad.n, array_position(v_made, v_bad.existing)
                USING ERRCODE = 'FQ001';
        ELSIF FOUND THEN
            RAISE EXCEPTION 'job %: idempotency key already names job % with other '
                'parameters', v_bad.n, v_bad.existing USING ERRCODE = 'FQ001';
        END IF;
    END IF;

    IF v_lanes IS NOT NULL THEN
        PERFORM pg_notify('fleetq_work', lane) FROM unnest(v_lanes) AS lane;
    END IF;

    IF v_all_new THEN
        RETURN QUERY SELECT m.id, true, 'queued'::text, m.class
                     FROM unnest(v_ids_by_n, v_class_by_n) AS m(id, class);
        RETURN;
    END IF;
    RETURN QUERY
    SELECT coalesce(i.made, j.id), i.made IS NOT NULL, coalesce(j.state, 'queued'),
           coalesce(j.priority_class,
                    CASE WHEN v_verifier THEN 0 WHEN p.release_gate THEN 1 ELSE 2 END)::smallint
    FROM unnest(p_projects, p_keys, v_made) WITH ORDINALITY AS i(project, key, made, n)
    JOIN fleetq.projects p ON p.name = i.project
    -- Each row's key is probed in the key's index, whatever the estimates: joined, a plan
    -- made for a large batch on a jobs table never analyzed sorted the whole table for a
    -- merge join. LIMIT 1 keeps
    -- the probe a probe (the key is unique): it is not pulled up into a join.
    LEFT JOIN LATERAL (SELECT j.id, j.state, j.priority_class
                       FROM fleetq.jobs j
                       WHERE i.made IS NULL AND j.project = i.project
                         AND j.submitted_by = p_submitted_by
                         AND j.idempotency_key = i.key
                       LIMIT 1) j ON true
    ORDER BY i.n;
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.submit_many(p_projects text[], p_operations text[], p_commits text[], p_nodes text[], p_keys text[], p_tasks text[], p_payloads jsonb[], p_traceparents text[], p_submitted_by text)
 RETURNS TABLE(job_id bigint, created boolean, state text, priority_class smallint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['submitter', 'operator']);
    IF c.kind <> 'admin' AND coalesce(cardinality(p_projects), 0) > 10000 THEN
        RAISE EXCEPTION 'a bulk submit of % jobs is over the limit of 10000 a call',
                        cardinality(p_projects)
            USING ERRCODE = 'FQ003';
    END IF;
    RETURN QUERY SELECT * FROM fleetq.submit_many_unchecked(
        p_projects, p_operations, p_commits, p_nodes, p_keys, p_tasks, p_payloads,
        p_traceparents, CASE WHEN c.kind = 'admin' THEN p_submitted_by ELSE c.subject END);
END;
$function$;
