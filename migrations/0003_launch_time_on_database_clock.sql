-- Launch times on the database's clock.
--
-- report_start recorded an execution's launched_at as the process start time the runner
-- reported. That time comes from the node (psutil derives it from the boot time, which
-- the kernel gives in whole seconds), so it could fall up to a second before the claim
-- that led to it, and overlap windows (measured against database-clock ends) came out
-- too long. The process start stays recorded as evidence of identity
-- (process_started_at); launched_at is now clamped between this lease's claim and the
-- start report, both database times. An adopted run still keeps its earlier start.

CREATE OR REPLACE FUNCTION fleetq.report_start(
    p_runner text, p_job bigint, p_version bigint, p_node text, p_run_id uuid, p_pid integer,
    p_process_started_at timestamptz, p_prepare_ms integer
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_claimed_at timestamptz;
BEGIN
    UPDATE fleetq.jobs
    SET state = 'running', started_at = clock_timestamp(), updated_at = clock_timestamp(),
        lease_expires_at = clock_timestamp() + fleetq.setting_seconds('lease_seconds')
    WHERE id = p_job AND lease_owner = p_runner AND lease_version = p_version AND state = 'claimed'
    RETURNING claimed_at INTO v_claimed_at;
    IF FOUND THEN
        INSERT INTO fleetq.executions
            (job_id, lease_version, runner_id, node, run_id, pid, process_started_at,
             prepared_at, launched_at, start_reported_at, prepare_ms)
        VALUES
            (p_job, p_version, p_runner, p_node, p_run_id, p_pid, p_process_started_at,
             clock_timestamp(),
             least(clock_timestamp(),
                   greatest(coalesce(p_process_started_at, clock_timestamp()), v_claimed_at)),
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
