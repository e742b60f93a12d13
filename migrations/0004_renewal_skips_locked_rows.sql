-- Renewal never waits on a job row, and a self-fenced run counts against the cap.
--
-- heartbeat locked every job row it renews with a plain FOR UPDATE. A handler's
-- ctx.transaction() holds its own job row for as long as the handler runs, so the
-- renewal of *all* the runner's leases waited behind it, unrelated jobs fenced
-- themselves, were handed back, claimed again by the same runner and fenced again (token
-- 1 -> 6 in 25 s, no loss and no reassignment counted). Now renewal skips rows another
-- transaction holds and answers 'busy' for them (neither renewed nor stale: the runner
-- knows whether its own handler holds the row, in which case nobody can take the lease
-- meanwhile: claims take queued jobs only and the reaper skips locked rows).
--
-- release(..., p_fenced => true) is the hand-back after a self-fence. Like an expiry it
-- counts a reassignment, and past reassignment_cap the job fails
-- (reassignments_exhausted), so no job can cycle through self-fences without end.

CREATE OR REPLACE FUNCTION fleetq.heartbeat(p_runner text, p_jobs bigint[], p_versions bigint[])
RETURNS TABLE (job_id bigint, status text, lease_expires_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_locked bigint[];
    v_ids bigint[];
    v_expiry timestamptz[];
    v_stale bigint[];
    v_stale_versions bigint[];
    v_lease interval := fleetq.setting_seconds('lease_seconds');
BEGIN
    SELECT array_agg(l.id) INTO v_locked
    FROM (SELECT j.id FROM fleetq.jobs j WHERE j.id = ANY (p_jobs)
          ORDER BY j.id FOR UPDATE SKIP LOCKED) l;
    WITH renewed AS (
        UPDATE fleetq.jobs j
        SET lease_expires_at = clock_timestamp() + v_lease
        FROM unnest(p_jobs, p_versions) AS i(id, version)
        WHERE j.id = i.id AND j.id = ANY (coalesce(v_locked, '{}'))
          AND j.lease_owner = p_runner AND j.lease_version = i.version
          AND j.state IN ('claimed', 'running')
        RETURNING j.id, j.lease_expires_at
    )
    SELECT array_agg(renewed.id), array_agg(renewed.lease_expires_at) INTO v_ids, v_expiry
    FROM renewed;

    -- stale: rows we could look at and that are no longer ours (a busy row is not known)
    SELECT array_agg(i.id), array_agg(i.version) INTO v_stale, v_stale_versions
    FROM unnest(p_jobs, p_versions) AS i(id, version)
    WHERE i.id <> ALL (coalesce(v_ids, '{}'))
      AND (i.id = ANY (coalesce(v_locked, '{}'))
           OR NOT EXISTS (SELECT 1 FROM fleetq.jobs j WHERE j.id = i.id));
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
           CASE WHEN e.id IS NOT NULL THEN 'ok'
                WHEN i.id = ANY (coalesce(v_stale, '{}')) THEN 'stale'
                ELSE 'busy' END,
           e.expiry
    FROM unnest(p_jobs) WITH ORDINALITY AS i(id, n)
    LEFT JOIN unnest(v_ids, v_expiry) AS e(id, expiry) ON e.id = i.id
    ORDER BY i.n;
END;
$$;

DROP FUNCTION fleetq.release(text, bigint, bigint, text);

CREATE FUNCTION fleetq.release(
    p_runner text, p_job bigint, p_version bigint, p_reason text, p_fenced boolean DEFAULT false
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
    SET ended_at = coalesce(ended_at, clock_timestamp()),
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
