-- Protocol: waiting for jobs to end (`fleetq wait`, `result --wait`, `logs --follow
-- --exit-status`). A waiter names the jobs it waits on, then LISTENs on `fleetq_done`;
-- record_ended (leases.sql) notifies it when one of them ends. Migration 0034 says why
-- endings notify only jobs someone waits on.
--
-- Applied by `fleetq migrate` whenever this file changes (CREATE OR REPLACE; every
-- changed protocol file in one transaction). Change a function here; tables, dropped
-- functions and new signatures go in a numbered migration.

-- Wait on `p_jobs` (none: stop waiting), instead of whatever this session waited on
-- before; the answer is their state now, so a waiter that LISTENs first and calls this
-- second misses no ending. Rows of sessions that are gone are removed on the way.
-- Whoever may read jobs may wait on them; a waiter touches only its own session's rows.
CREATE OR REPLACE FUNCTION fleetq.watch_jobs(p_jobs bigint[])
 RETURNS TABLE(job_id bigint, state text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    PERFORM fleetq.require(ARRAY['reader', 'submitter', 'operator']);
    IF cardinality(p_jobs) > 1000 THEN
        RAISE EXCEPTION 'wait on at most 1000 jobs at once (got %)', cardinality(p_jobs)
            USING ERRCODE = 'FQ003';
    END IF;
    DELETE FROM fleetq.job_watchers w WHERE w.pid = pg_backend_pid();
    -- the rows of sessions that are gone, but none another transaction holds: a waiter
    -- that removed them in a transaction it kept open made every other waiter wait
    DELETE FROM fleetq.job_watchers w
    WHERE (w.job_id, w.pid) IN (SELECT d.job_id, d.pid FROM fleetq.job_watchers d
        WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = d.pid)
        FOR UPDATE SKIP LOCKED);
    INSERT INTO fleetq.job_watchers (job_id, pid)
    SELECT DISTINCT j, pg_backend_pid() FROM unnest(p_jobs) AS j
    ON CONFLICT DO NOTHING;
    RETURN QUERY SELECT j.id, j.state FROM fleetq.jobs j WHERE j.id = ANY (p_jobs);
END;
$function$;
