-- Protocol: pruning history (`fleetq prune --before DATE`, fleetq/core/prune.py). A job
-- goes when everything recorded about it is older than the cutoff, with every row that
-- names it; events tied to no job go when older than the cutoff. Each call is one batch
-- in its own transaction: a slice of the table in id order, `p_after` the last id of the
-- slice before, so the caller walks the history once and never holds one long
-- transaction. An administrator's functions (no group is granted them).
--
-- What stays, and why:
-- - A job that has not ended, or ended at or after the cutoff.
-- - A job something still settles: a cancelled job whose runner has not confirmed the stop
--   (it holds the runner's capacity, reserved_on), a run whose end its runner has yet to
--   report (confirm_stop names the job, and a runner that met an unknown job there would
--   retry for ever), or anything recorded about it at or after the cutoff (a confirmed
--   stop, a refused late write): its history is not all older than the cutoff.
-- - A job that a job which stays depends on, directly or down a chain: a waiting job's
--   dependencies must still resolve (settle_dependents, waiting_on read them), and a
--   kept job keeps the list of what it waited for.
-- - A job whose row another transaction holds (a cancel reading it, a submit naming it in
--   --after): skipped, never waited for; a later prune takes it.
-- - The newest event, so max(events.id), which the console polls to notice news, never
--   goes back (if it belongs to a pruned job it stays alone, and a later prune takes it).
-- - The fenced ledger and its writes: they are the fenced resource's own state, keyed by
--   resource, not the queue's history (a ledger forgetting a key's highest token would
--   accept a stale one again).
--
-- Applied by `fleetq migrate` whenever this file changes (CREATE OR REPLACE; every
-- changed protocol file in one transaction). Change a function here; tables, dropped
-- functions and new signatures go in a numbered migration.

-- THE rule for what a job's own record allows: it ended before the cutoff (finished_at is
-- set exactly in the terminal states, by a CHECK on jobs) and nothing of it is still
-- settling or newer than the cutoff. Whether a job that stays depends on it is judged
-- apart (prune_jobs). Never NULL: an unfinished job is not prunable, and an unfinished
-- dependent must count as one that stays. plpgsql: planned once per connection.
CREATE OR REPLACE FUNCTION fleetq.job_prunable(p_job bigint, p_finished_at timestamptz, p_reserved_on text, p_before timestamptz)
 RETURNS boolean
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
    RETURN coalesce(p_finished_at < p_before, false)
       AND p_reserved_on IS NULL
       AND NOT EXISTS (SELECT 1 FROM fleetq.executions e
                       WHERE e.job_id = p_job AND (e.ended_at IS NULL OR e.ended_at >= p_before))
       AND NOT EXISTS (SELECT 1 FROM fleetq.events e
                       WHERE e.job_id = p_job AND e.at >= p_before);
END;
$function$;

-- Refuse a cutoff that is not in the past on the database's clock, and a batch below 1.
CREATE OR REPLACE FUNCTION fleetq.prune_check(p_before timestamptz, p_limit integer)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM fleetq.require('{}');  -- administrators only (no group is granted prune)
    IF p_before IS NULL OR p_before > clock_timestamp() THEN
        RAISE EXCEPTION 'prune takes a cutoff in the past (got %, the database''s clock says %)',
            p_before, clock_timestamp() USING ERRCODE = 'FQ003';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'a prune batch takes at least one job (got %)', p_limit
            USING ERRCODE = 'FQ003';
    END IF;
END;
$function$;

-- One batch of jobs: the next `p_limit` jobs after id `p_after`. Returns the slice's last
-- id (where the next batch starts), whether to go on, the rows removed per table (or, with
-- p_dry_run, the rows that would be: nothing is locked or deleted) and the jobs of the
-- slice that ended before the cutoff but stay, by reason.
CREATE OR REPLACE FUNCTION fleetq.prune_jobs(p_before timestamptz, p_after bigint, p_limit integer, p_dry_run boolean DEFAULT false)
 RETURNS TABLE(last_id bigint, more boolean, jobs bigint, executions bigint, events bigint, verdicts bigint, outputs bigint, dependencies bigint, notifications bigint, ticks bigint, held bigint, unsettled bigint, needed bigint)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_last bigint;
    v_more boolean;
    v_ended bigint[];    -- of the slice: prunable by their own record
    v_unsettled bigint;
    v_free bigint[];     -- of those, the ones no other transaction holds
    v_needed bigint[];   -- of those, the ones a job that stays depends on
    v_take bigint[];
    v_newest bigint := (SELECT max(e.id) FROM fleetq.events e);
    v_jobs bigint := 0;
    v_executions bigint := 0;
    v_events bigint := 0;
    v_verdicts bigint := 0;
    v_outputs bigint := 0;
    v_dependencies bigint := 0;
    v_notifications bigint := 0;
    v_ticks bigint := 0;
BEGIN
    PERFORM fleetq.prune_check(p_before, p_limit);
    -- The slice, read without locking anything. Ids follow submission and a job ends
    -- after it was submitted: once a whole slice was submitted at or after the cutoff, no
    -- later job can have ended before it, and the walk stops (a job submitted in the same
    -- instant as the cutoff may be left to the next prune; none is ever taken wrongly).
    SELECT max(s.id), coalesce(bool_or(s.created_at < p_before), false),
           array_agg(s.id ORDER BY s.id) FILTER (WHERE s.prunable),
           count(*) FILTER (WHERE s.finished_at < p_before AND NOT s.prunable)
    INTO v_last, v_more, v_ended, v_unsettled
    FROM (SELECT j.id, j.created_at, j.finished_at,
                 fleetq.job_prunable(j.id, j.finished_at, j.reserved_on, p_before) AS prunable
          FROM fleetq.jobs j
          WHERE j.id > p_after
          ORDER BY j.id
          LIMIT p_limit) s;
    IF v_last IS NULL THEN  -- past the last job
        RETURN QUERY SELECT p_after, false, 0::bigint, 0::bigint, 0::bigint, 0::bigint,
                            0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint,
                            0::bigint;
        RETURN;
    END IF;
    -- Lock them, skipping any row another transaction holds: prune never waits, and what
    -- it skips a later prune takes. Only ended jobs are locked, never a live one (a claim
    -- would skip it, an outcome wait for it). Their record can only settle further (a
    -- stop confirmed, a run's end reported): no need to judge them again. An event about
    -- one committed since (a retried report) is not deleted with it: it is newer than the
    -- cutoff, and a later prune takes it (prune_events). A dry run locks nothing.
    IF p_dry_run THEN
        v_free := v_ended;
    ELSE
        SELECT array_agg(l.id ORDER BY l.id) INTO v_free
        FROM (SELECT j.id FROM fleetq.jobs j WHERE j.id = ANY (v_ended)
              ORDER BY j.id FOR UPDATE SKIP LOCKED) l;
    END IF;
    -- Which of them a job that stays depends on, down any chain of dependents. A new
    -- statement, so a new snapshot: it sees every dependency committed so far, and a new
    -- one naming a locked job waits for this transaction (its foreign key's KEY SHARE
    -- lock), then finds the job gone and fails: nothing can come to depend on a job
    -- between this judgement and its deletion.
    WITH RECURSIVE dependents(root, id) AS (
        SELECT jd.depends_on, jd.job_id
        FROM fleetq.job_dependencies jd WHERE jd.depends_on = ANY (v_free)
        UNION
        SELECT d.root, jd.job_id
        FROM dependents d JOIN fleetq.job_dependencies jd ON jd.depends_on = d.id
    )
    SELECT array_agg(DISTINCT d.root) INTO v_needed
    FROM dependents d JOIN fleetq.jobs j ON j.id = d.id
    WHERE NOT fleetq.job_prunable(j.id, j.finished_at, j.reserved_on, p_before);
    v_take := ARRAY(SELECT f FROM unnest(v_free) AS f WHERE f <> ALL (coalesce(v_needed, '{}'))
                    ORDER BY f);

    IF cardinality(v_take) > 0 AND p_dry_run THEN
        v_jobs := cardinality(v_take);
        SELECT (SELECT count(*) FROM fleetq.executions WHERE job_id = ANY (v_take)),
               (SELECT count(*) FROM fleetq.events
                WHERE job_id = ANY (v_take) AND at < p_before AND id IS DISTINCT FROM v_newest),
               (SELECT count(*) FROM fleetq.verdicts WHERE job_id = ANY (v_take)),
               (SELECT count(*) FROM fleetq.job_output WHERE job_id = ANY (v_take)),
               -- from the dependent's end only: every job depending on one taken here
               -- is taken too, in this batch or a later one, which counts the edge once
               (SELECT count(*) FROM fleetq.job_dependencies WHERE job_id = ANY (v_take)),
               (SELECT count(*) FROM fleetq.task_notifications WHERE job_id = ANY (v_take)),
               (SELECT count(*) FROM fleetq.schedule_ticks WHERE job_id = ANY (v_take))
        INTO v_executions, v_events, v_verdicts, v_outputs, v_dependencies, v_notifications,
             v_ticks;
    ELSIF cardinality(v_take) > 0 THEN
        -- events are append-only; the trigger lets this transaction delete those older
        -- than its cutoff (migration 0022), which is all a prunable job had when judged
        PERFORM set_config('fleetq.prune_before', extract(epoch FROM p_before)::text, true);
        DELETE FROM fleetq.job_dependencies WHERE job_id = ANY (v_take) OR depends_on = ANY (v_take);
        GET DIAGNOSTICS v_dependencies = ROW_COUNT;
        DELETE FROM fleetq.executions WHERE job_id = ANY (v_take);
        GET DIAGNOSTICS v_executions = ROW_COUNT;
        DELETE FROM fleetq.events
        WHERE job_id = ANY (v_take) AND at < p_before AND id IS DISTINCT FROM v_newest;
        GET DIAGNOSTICS v_events = ROW_COUNT;
        DELETE FROM fleetq.verdicts WHERE job_id = ANY (v_take);
        GET DIAGNOSTICS v_verdicts = ROW_COUNT;
        DELETE FROM fleetq.job_output WHERE job_id = ANY (v_take);
        GET DIAGNOSTICS v_outputs = ROW_COUNT;
        DELETE FROM fleetq.task_notifications WHERE job_id = ANY (v_take);
        GET DIAGNOSTICS v_notifications = ROW_COUNT;
        DELETE FROM fleetq.busy_renewals WHERE job_id = ANY (v_take);
        DELETE FROM fleetq.schedule_ticks WHERE job_id = ANY (v_take);
        GET DIAGNOSTICS v_ticks = ROW_COUNT;
        DELETE FROM fleetq.jobs WHERE id = ANY (v_take);
        GET DIAGNOSTICS v_jobs = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT v_last, v_more, v_jobs, v_executions, v_events, v_verdicts, v_outputs,
                        v_dependencies, v_notifications, v_ticks,
                        coalesce(cardinality(v_ended), 0)::bigint
                            - coalesce(cardinality(v_free), 0),
                        v_unsettled, coalesce(cardinality(v_needed), 0)::bigint;
END;
$function$;

-- One batch of the events older than the cutoff that are tied to no job (a runner
-- registered or forgotten, an operation or a schedule removed, a schedule's skipped
-- ticks) or to a job that no longer exists (a pruned job's newest event, kept while it
-- was the newest, or one logged after the job was judged): the next `p_limit` events
-- after id `p_after`, in id order. Nothing reads these events to decide anything (the
-- runners' state is in their rows); they are history only. No event is locked by anyone
-- (append-only), so there is nothing to wait for.
CREATE OR REPLACE FUNCTION fleetq.prune_events(p_before timestamptz, p_after bigint, p_limit integer, p_dry_run boolean DEFAULT false)
 RETURNS TABLE(last_id bigint, more boolean, events bigint)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_last bigint;
    v_more boolean;
    v_take bigint[];
    v_newest bigint := (SELECT max(e.id) FROM fleetq.events e);
    v_events bigint := 0;
BEGIN
    PERFORM fleetq.prune_check(p_before, p_limit);
    -- as for jobs: events are numbered as they are written, so once a whole slice is at
    -- or after the cutoff, so is every later event
    SELECT max(s.id), coalesce(bool_or(s.at < p_before), false),
           array_agg(s.id ORDER BY s.id) FILTER (
               WHERE s.at < p_before AND s.id IS DISTINCT FROM v_newest
                 AND (s.job_id IS NULL
                      OR NOT EXISTS (SELECT 1 FROM fleetq.jobs j WHERE j.id = s.job_id)))
    INTO v_last, v_more, v_take
    FROM (SELECT e.id, e.at, e.job_id FROM fleetq.events e
          WHERE e.id > p_after ORDER BY e.id LIMIT p_limit) s;
    IF v_take IS NOT NULL AND p_dry_run THEN
        v_events := cardinality(v_take);
    ELSIF v_take IS NOT NULL THEN
        PERFORM set_config('fleetq.prune_before', extract(epoch FROM p_before)::text, true);
        DELETE FROM fleetq.events WHERE id = ANY (v_take);
        GET DIAGNOSTICS v_events = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT coalesce(v_last, p_after), v_more AND v_last IS NOT NULL, v_events;
END;
$function$;
