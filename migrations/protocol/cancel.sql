-- Protocol: Cancel: a queued job ends at once; a live one ends and its runner is asked to stop
-- the process (the stop request), holding its capacity until the stop is confirmed.
--
-- Applied by `fleetq migrate` whenever this file changes (CREATE OR REPLACE; every
-- changed protocol file in one transaction). Change a function here; tables, dropped
-- functions and new signatures go in a numbered migration.

-- ---------------------------------------------------------------------------------------
-- Operator and maintenance transitions
CREATE OR REPLACE FUNCTION fleetq.cancel_unchecked(p_job bigint, p_actor text, p_reason text)
 RETURNS TABLE(job_id bigint, previous_state text, state text, stop_pending boolean)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    j fleetq.jobs%ROWTYPE;
    v_live boolean;
BEGIN
    -- NO KEY: a dependent submit's KEY SHARE never holds a cancel up (settle_dependents)
    SELECT * INTO j FROM fleetq.jobs WHERE id = p_job FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown job %', p_job USING ERRCODE = 'FQ004';
    END IF;
    IF j.state NOT IN ('waiting', 'queued', 'claimed', 'running') THEN
        RETURN QUERY SELECT j.id, j.state, j.state, false;  -- already terminal: nothing to do
        RETURN;
    END IF;
    v_live := j.state IN ('claimed', 'running');
    PERFORM fleetq.record_handler_runs(ARRAY[p_job]);  -- before its lease ends
    -- Terminal at once (DESIGN §1.7); the lease ends, so any write by the old owner is
    -- stale from here on, but the capacity stays reserved until the runner confirms the
    -- stop: cancellation is not a stop.
    UPDATE fleetq.jobs
    SET state = 'cancelled', finished_at = clock_timestamp(), updated_at = clock_timestamp(),
        cancel_requested_at = clock_timestamp(), cancelled_by = p_actor, cancel_reason = p_reason,
        lease_owner = NULL, lease_expires_at = NULL, retry_at = NULL
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
$function$;

-- An operator cancels any job; a submitter only the jobs it submitted. A job that does not
-- exist is unknown to every caller (as a read says), not forbidden.
CREATE OR REPLACE FUNCTION fleetq.cancel(p_job bigint, p_actor text, p_reason text)
 RETURNS TABLE(job_id bigint, previous_state text, state text, stop_pending boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['submitter', 'operator']);
    IF c.kind = 'submitter' AND EXISTS (
        SELECT 1 FROM fleetq.jobs j WHERE j.id = p_job AND j.submitted_by <> c.subject) THEN
        RAISE EXCEPTION 'submitter % may cancel only its own jobs', c.subject
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN QUERY SELECT * FROM fleetq.cancel_unchecked(
        p_job, CASE WHEN c.kind = 'admin' THEN p_actor ELSE c.subject END,
        left(p_reason, 2000));  -- shown to operators: bounded as outcome reasons are
END;
$function$;
