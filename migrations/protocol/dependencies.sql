-- Protocol: dependencies between jobs (`submit --after`). A job with unmet dependencies
-- is `waiting`, outside the queued index (the claim pays nothing for it). When a job
-- ends, record_outcomes (which every ending passes through) settles the jobs waiting on
-- it here: one that failed, was refused or cancelled cancels them, naming it; the last
-- one to succeed queues them.
--
-- Applied by `fleetq migrate` whenever this file changes (CREATE OR REPLACE; every
-- changed protocol file in one transaction). Change a function here; tables, dropped
-- functions and new signatures go in a numbered migration.

CREATE OR REPLACE FUNCTION fleetq.settle_dependents(p_ended bigint[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_waiting bigint[];
    v_ready bigint[];
    v_lanes text[];
    d record;
BEGIN
    SELECT array_agg(DISTINCT jd.job_id) INTO v_waiting
    FROM fleetq.job_dependencies jd WHERE jd.depends_on = ANY (p_ended);
    IF v_waiting IS NULL THEN
        RETURN;  -- the usual case: one probe of job_dependencies_on
    END IF;
    -- Lock the waiting jobs first, then read their dependencies in new statements: two
    -- dependencies ending at once serialize here, and the second one sees the first.
    PERFORM 1 FROM fleetq.jobs WHERE id = ANY (v_waiting) AND state = 'waiting'
    ORDER BY id FOR UPDATE;
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
    IF v_ready IS NOT NULL THEN
        PERFORM fleetq.log_events('ready', v_ready, NULL,
                                  array_fill(0::bigint, ARRAY[cardinality(v_ready)]), 'fleetq',
                                  '{"reason": "dependencies succeeded"}');
        PERFORM pg_notify('fleetq_work', lane) FROM unnest(v_lanes) AS lane;
    END IF;
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
