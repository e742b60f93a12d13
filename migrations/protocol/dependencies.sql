-- Protocol: dependencies between jobs (`submit --after`). A job with unmet dependencies
-- is `waiting`, outside the queued index (the claim pays nothing for it). When a job
-- ends, record_ended (which every ending passes through) settles the jobs waiting on
-- it here: one that failed, was refused or cancelled cancels them, naming it; the last
-- one to succeed queues them.
--
-- Applied by `fleetq migrate` whenever this file changes (CREATE OR REPLACE; every
-- changed protocol file in one transaction). Change a function here; tables, dropped
-- functions and new signatures go in a numbered migration.

-- Jobs just moved from waiting to queued: their `ready` events, and a wake-up for each
-- of their lanes' claimers (the one place both kinds of waiting end).
CREATE OR REPLACE FUNCTION fleetq.announce_ready(p_ids bigint[], p_lanes text[], p_reason text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF p_ids IS NULL THEN
        RETURN;
    END IF;
    PERFORM fleetq.log_events('ready', p_ids, NULL, array_fill(0::bigint, ARRAY[cardinality(p_ids)]),
                              'fleetq', jsonb_build_object('reason', p_reason));
    PERFORM pg_notify('fleetq_work', lane) FROM unnest(p_lanes) AS lane;
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.settle_dependents(p_ended bigint[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_waiting bigint[];
    v_ready bigint[];
    v_lanes text[];
    v_sure bigint[];
    v_locked bigint[];
    d record;
BEGIN
    PERFORM fleetq.require_read_committed('ending a job');
    -- A dependent submit in flight holds an ended job's row in KEY SHARE, and its
    -- dependency is not visible here yet: such a row refuses FOR UPDATE, and is settled
    -- again by the reaper's leader once nothing holds it (migration 0038).
    SELECT array_agg(e.id) INTO v_sure
    FROM (SELECT j.id FROM fleetq.jobs j WHERE j.id = ANY (p_ended)
          ORDER BY j.id FOR UPDATE SKIP LOCKED) e;
    IF coalesce(cardinality(v_sure), 0) < coalesce(cardinality(p_ended), 0) THEN
        INSERT INTO fleetq.settle_again (job_id)
        SELECT j.id FROM fleetq.jobs j  -- a job pruned since is nobody's dependency
        WHERE j.id = ANY (p_ended) AND j.id <> ALL (coalesce(v_sure, '{}'))
        ON CONFLICT DO NOTHING;
    END IF;
    SELECT array_agg(DISTINCT jd.job_id) INTO v_waiting
    FROM fleetq.job_dependencies jd JOIN fleetq.jobs w ON w.id = jd.job_id
    WHERE jd.depends_on = ANY (p_ended) AND w.state = 'waiting';
    IF v_waiting IS NULL THEN
        RETURN;  -- the usual case: one probe of job_dependencies_on
    END IF;
    -- Lock the waiting jobs first, then read their dependencies in new statements: two
    -- dependencies ending at once serialize here, and the second one sees the first.
    -- One another transaction holds past a moment (its submitter cancelling it in a
    -- transaction kept open) is not waited for: what it waits on is settled again.
    v_locked := fleetq.lock_jobs(v_waiting, NULL, 'waiting');
    IF cardinality(v_locked) < cardinality(v_waiting) THEN
        INSERT INTO fleetq.settle_again (job_id)
        SELECT DISTINCT jd.depends_on FROM fleetq.job_dependencies jd
        WHERE jd.job_id = ANY (v_waiting) AND jd.job_id <> ALL (v_locked)
          AND jd.depends_on = ANY (p_ended)
        ON CONFLICT DO NOTHING;
        v_waiting := v_locked;
    END IF;
    FOR d IN
        SELECT DISTINCT ON (w.id) w.id, dep.id AS dep_id, dep.state AS dep_state
        FROM fleetq.jobs w
        JOIN fleetq.job_dependencies jd ON jd.job_id = w.id
        JOIN fleetq.jobs dep ON dep.id = jd.depends_on
        WHERE w.id = ANY (v_waiting) AND w.state = 'waiting'
          AND dep.state IN ('failed', 'refused', 'cancelled')
        ORDER BY w.id, dep.id
    LOOP
        PERFORM fleetq.cancel_unchecked(
            d.id, 'fleetq', format('dependency failed: job %s %s', d.dep_id, d.dep_state));
    END LOOP;
    WITH ready AS (
        UPDATE fleetq.jobs w SET state = 'queued', updated_at = clock_timestamp()
        WHERE w.id = ANY (v_waiting) AND w.state = 'waiting'
          AND NOT EXISTS (SELECT 1 FROM fleetq.job_dependencies jd
                          JOIN fleetq.jobs dep ON dep.id = jd.depends_on
                          WHERE jd.job_id = w.id AND dep.state <> 'succeeded')
        RETURNING w.id, w.lane
    )
    SELECT array_agg(id ORDER BY id), array_agg(DISTINCT lane) INTO v_ready, v_lanes FROM ready;
    PERFORM fleetq.announce_ready(v_ready, v_lanes, 'dependencies succeeded');
END;
$function$;

-- What a waiting job still waits for: its dependencies that have not succeeded (empty
-- for any other state, without reading the dependencies).
CREATE OR REPLACE FUNCTION fleetq.waiting_on(p_job bigint, p_state text)
 RETURNS bigint[]
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE WHEN p_state <> 'waiting' THEN '{}'::bigint[] ELSE
        ARRAY(SELECT jd.depends_on FROM fleetq.job_dependencies jd
              JOIN fleetq.jobs d ON d.id = jd.depends_on
              WHERE jd.job_id = p_job AND d.state <> 'succeeded' ORDER BY jd.depends_on)
    END
$function$;

-- Of jobs just failed (`p_done`), those whose operation's retry policy applies wait to
-- run again (attempts + 1, retry_at after the backoff) instead of ending; returns them.
-- Policy (operations.retry): max_attempts (in all), backoff_seconds (first delay),
-- backoff_max_seconds, on (reasons: exception, timeout, exit), exit_codes (for exit:
-- only these; none listed: any). Delay: min(max, first * 2^(attempt-1)), jittered to
-- between half and all of it, so a fleet's retries do not arrive together.
CREATE OR REPLACE FUNCTION fleetq.schedule_retries(p_done bigint[], p_exit_codes integer[])
 RETURNS bigint[]
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_retried bigint[];
BEGIN
    WITH due AS (
        SELECT j.id, j.attempts,
               least(coalesce((o.retry->>'backoff_max_seconds')::float8, 600),
                     coalesce((o.retry->>'backoff_seconds')::float8, 10)
                         * power(2, j.attempts - 1)) * (0.5 + random() * 0.5) AS delay_s
        FROM fleetq.jobs j
        JOIN fleetq.operations o ON o.project = j.project AND o.name = j.operation
        JOIN unnest(p_done, p_exit_codes) AS i(id, exit_code) ON i.id = j.id
        WHERE j.state = 'failed'
          AND j.attempts < coalesce((o.retry->>'max_attempts')::integer, 1)
          AND coalesce(o.retry->'on', '[]'::jsonb) ? j.failure_reason
          AND (j.failure_reason <> 'exit'
               OR jsonb_array_length(coalesce(o.retry->'exit_codes', '[]'::jsonb)) = 0
               OR o.retry->'exit_codes' @> to_jsonb(i.exit_code))
    ),
    retried AS (
        UPDATE fleetq.jobs j
        SET state = 'waiting', finished_at = NULL, attempts = j.attempts + 1,
            retry_at = clock_timestamp() + make_interval(secs => due.delay_s),
            updated_at = clock_timestamp()
        FROM due WHERE j.id = due.id
        RETURNING j.id, j.attempts, j.retry_at, j.failure_reason
    ),
    logged AS (
        INSERT INTO fleetq.events (kind, job_id, lease_version, actor, detail)
        SELECT 'retrying', r.id, 0, 'fleetq',
               jsonb_build_object('attempt', r.attempts, 'retry_at', r.retry_at,
                                  'after', r.failure_reason)
        FROM retried r
    )
    SELECT array_agg(id) INTO v_retried FROM retried;
    RETURN coalesce(v_retried, '{}');
END;
$function$;

-- The reaper's leader queues the retries that are due (their dependencies, if any,
-- had all succeeded before the first attempt ran).
CREATE OR REPLACE FUNCTION fleetq.queue_due_retries(p_now timestamptz DEFAULT NULL)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_ids bigint[];
    v_lanes text[];
BEGIN
    WITH due AS (
        SELECT j.id FROM fleetq.jobs j
        WHERE j.state = 'waiting' AND j.retry_at <= coalesce(p_now, clock_timestamp())
        ORDER BY j.retry_at LIMIT 1000
        FOR NO KEY UPDATE SKIP LOCKED
    ),
    queued AS (
        UPDATE fleetq.jobs j SET state = 'queued', retry_at = NULL, updated_at = clock_timestamp()
        FROM due WHERE j.id = due.id
        RETURNING j.id, j.lane
    )
    SELECT array_agg(id ORDER BY id), array_agg(DISTINCT lane) INTO v_ids, v_lanes FROM queued;
    PERFORM fleetq.announce_ready(v_ids, v_lanes, 'retry due');
    RETURN coalesce(cardinality(v_ids), 0);
END;
$function$;

-- Seconds until the next retry falls due (0 when one is due now, NULL when none waits):
-- the runner that recorded a failed attempt runs a reaper pass then, so a backoff is
-- kept to, not rounded up to the reap interval. One probe of jobs_retry_due; it names
-- no job.
CREATE OR REPLACE FUNCTION fleetq.next_retry_in()
 RETURNS double precision
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT greatest(0, extract(epoch FROM min(j.retry_at) - clock_timestamp()))::double precision
    FROM fleetq.jobs j
    WHERE j.state = 'waiting' AND j.retry_at IS NOT NULL
$function$;

-- Settle again the ended jobs whose rows were held when they ended (settle_dependents):
-- those nothing holds now, whose dependents in flight have committed or given up. Run by
-- the reaper's leader; a row still held waits for a later pass.
CREATE OR REPLACE FUNCTION fleetq.settle_pending()
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_free bigint[];
BEGIN
    WITH taken AS (
        DELETE FROM fleetq.settle_again s
        WHERE s.job_id IN (SELECT a.job_id FROM fleetq.settle_again a
                           ORDER BY a.job_id LIMIT 1000)
        RETURNING s.job_id
    )
    SELECT array_agg(t.job_id ORDER BY t.job_id) INTO v_free FROM taken t;
    IF v_free IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM fleetq.settle_dependents(v_free);  -- names again those still held
    RETURN cardinality(v_free);
END;
$function$;
