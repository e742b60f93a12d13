-- Execution ends on the database's clock, and executions for handler jobs.
--
-- An execution's end was the database time its end was *recorded*: an outcome, a
-- confirmed stop or a release written after the runner reconnected. A self-fenced run
-- stopped 1.7 s before the next token started was reported as a 2.7 s overlap, because
-- its end was recorded only when the partition healed. The runner now sends, with each
-- write that ends an execution, how long ago (on its monotonic clock, read when the
-- request is sent) the process exited; the database sets the end to its own time minus
-- that. The result is an upper bound on the true end, late by the request's transit
-- only, and never earlier than the launch. executions.end_measured says which ends were
-- measured so; any other end (a claim reported lost, a run closed by the collection
-- pass after a restart) is only bounded: the run ended at or before it.
--
-- Handler jobs run in the runner's process and had no executions row, so a handler
-- frozen past its lease (a stopped runner) overlapped its next token invisibly. The
-- claim now records a handler's execution: for an in-process handler the claim is the
-- launch.

ALTER TABLE fleetq.executions ADD COLUMN end_measured boolean NOT NULL DEFAULT false;

-- The end of an execution that ended p_ago_ms before now (NULL: unknown, now is an
-- upper bound), never before its launch.
CREATE FUNCTION fleetq.measured_end(p_launched timestamptz, p_ago_ms integer)
RETURNS timestamptz
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN p_ago_ms IS NULL THEN clock_timestamp()
                ELSE greatest(coalesce(p_launched, '-infinity'),
                              clock_timestamp() - make_interval(secs => p_ago_ms / 1000.0))
           END
$$;

CREATE OR REPLACE FUNCTION fleetq.claim(p_runner text, p_lane text, p_limit integer, p_claim_id uuid)
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
    ),
    started AS (
        -- An in-process handler starts when it is claimed: its execution is recorded
        -- now, so a handler frozen past its lease shows its overlap with the next token.
        INSERT INTO fleetq.executions
            (job_id, lease_version, runner_id, node, run_id, launched_at, start_reported_at)
        SELECT t.id, t.lease_version, p_runner, r.node, gen_random_uuid(), t.claimed_at,
               t.claimed_at
        FROM taken t
        JOIN fleetq.operations o ON o.project = t.project AND o.name = t.operation
        WHERE o.handler IS NOT NULL
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

DROP FUNCTION fleetq.complete(text, bigint[], bigint[], text[], integer[], text[], text[],
                              integer[], integer[]);

CREATE FUNCTION fleetq.complete(
    p_runner text, p_jobs bigint[], p_versions bigint[], p_outcomes text[],
    p_exit_codes integer[], p_reasons text[], p_log_tails text[], p_prepare_ms integer[],
    p_run_ms integer[], p_ended_ago_ms integer[]
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
        SET ended_at = coalesce(e.ended_at, fleetq.measured_end(e.launched_at, i.ago)),
            end_measured = CASE WHEN e.ended_at IS NULL THEN i.ago IS NOT NULL
                                ELSE e.end_measured END,
            exit_code = i.exit_code, run_ms = i.run_ms
        FROM unnest(p_jobs, p_versions, p_exit_codes, p_run_ms, p_ended_ago_ms)
             AS i(id, version, exit_code, run_ms, ago)
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
    -- A stale outcome changes no job, but it is evidence: the writer's own execution
    -- under that token has ended (a zombie's run, say), which closes its overlap window.
    UPDATE fleetq.executions e
    SET ended_at = fleetq.measured_end(e.launched_at, i.ago), end_measured = i.ago IS NOT NULL,
        exit_code = i.exit_code, run_ms = i.run_ms
    FROM unnest(p_jobs, p_versions, p_exit_codes, p_run_ms, p_ended_ago_ms)
         AS i(id, version, exit_code, run_ms, ago)
    WHERE e.job_id = i.id AND e.lease_version = i.version AND e.runner_id = p_runner
      AND e.ended_at IS NULL AND i.id = ANY (coalesce(v_stale, '{}'));

    RETURN QUERY
    SELECT i.id,
           CASE WHEN i.id = ANY (coalesce(v_done, '{}')) THEN 'ok'
                WHEN i.id = ANY (coalesce(v_already, '{}')) THEN 'already'
                ELSE 'stale' END
    FROM unnest(p_jobs) WITH ORDINALITY AS i(id, n)
    ORDER BY i.n;
END;
$$;

DROP FUNCTION fleetq.confirm_stop(text, bigint, bigint, integer, text);

CREATE FUNCTION fleetq.confirm_stop(
    p_runner text, p_job bigint, p_version bigint, p_signal integer, p_reason text,
    p_ended_ago_ms integer DEFAULT NULL
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
    SET ended_at = coalesce(ended_at, fleetq.measured_end(launched_at, p_ended_ago_ms)),
        end_measured = CASE WHEN ended_at IS NULL THEN p_ended_ago_ms IS NOT NULL
                            ELSE end_measured END,
        signal = p_signal,
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

DROP FUNCTION fleetq.release(text, bigint, bigint, text, boolean);

CREATE FUNCTION fleetq.release(
    p_runner text, p_job bigint, p_version bigint, p_reason text, p_fenced boolean DEFAULT false,
    p_ended_ago_ms integer DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    j fleetq.jobs%ROWTYPE;
    v_answer text;
    v_fail boolean;
BEGIN
    v_answer := fleetq.hand_back_guard(p_runner, p_job, p_version, 'release');
    IF v_answer IS NOT NULL THEN
        RETURN v_answer;
    END IF;
    SELECT * INTO j FROM fleetq.jobs WHERE id = p_job;
    v_fail := p_fenced AND j.reassign_count + 1 > fleetq.setting_int('reassignment_cap');
    UPDATE fleetq.jobs
    SET state = CASE WHEN v_fail THEN 'failed' ELSE 'queued' END,
        failure_reason = CASE WHEN v_fail THEN 'reassignments_exhausted' END,
        finished_at = CASE WHEN v_fail THEN clock_timestamp() END,
        reassign_count = reassign_count + CASE WHEN p_fenced THEN 1 ELSE 0 END,
        lease_owner = NULL, lease_expires_at = NULL, reserved_on = NULL,
        claim_id = NULL, released_by = p_runner, released_version = p_version,
        released_kind = 'release', updated_at = clock_timestamp()
    WHERE id = p_job;
    PERFORM fleetq.give_back(ARRAY[p_runner], ARRAY[j.lane], ARRAY[j.memory_mb], ARRAY[j.cpu_millis]);
    UPDATE fleetq.executions
    SET ended_at = coalesce(ended_at, fleetq.measured_end(launched_at, p_ended_ago_ms)),
        end_measured = CASE WHEN ended_at IS NULL THEN p_ended_ago_ms IS NOT NULL
                            ELSE end_measured END,
        stop_reason = coalesce(stop_reason, CASE WHEN p_fenced THEN 'self_fenced' ELSE 'shutdown' END),
        stop_confirmed = true
    WHERE job_id = p_job AND lease_version = p_version;
    PERFORM fleetq.log_events('released', ARRAY[p_job], p_runner, ARRAY[p_version], NULL,
                              jsonb_build_object('reason', p_reason, 'fenced', p_fenced));
    IF v_fail THEN
        PERFORM fleetq.record_outcomes(ARRAY[p_job], ARRAY[NULL::integer], ARRAY[NULL::text],
                                       ARRAY[NULL::integer], ARRAY[NULL::integer]);
        PERFORM fleetq.log_events('failed', ARRAY[p_job], p_runner, ARRAY[p_version], NULL,
                                  '{"reason": "reassignments_exhausted"}');
        RETURN 'failed';
    END IF;
    PERFORM pg_notify('fleetq_work', j.lane);
    RETURN 'ok';
END;
$$;
