-- Recovery never waits on a runner cut off mid-transaction (issue 12).
--
-- Seen in the fault suite: a runner partitioned inside a handler's transaction (which
-- holds its own `runners` row once the handler's outcome is written in it) left that
-- session idle in transaction on the server, holding the row until
-- idle_in_transaction_session_timeout. The reaper requeued the partitioned runner's
-- expired jobs and then waited on its row to give the capacity back, holding the rows
-- it had already locked, including other runners' rows; their heartbeats waited behind
-- it, so healthy runners fenced their own jobs again and again, and no expired lease in
-- the fleet was recovered until the stuck session died.
--
-- Now nothing on the recovery path waits for a runner row:
-- - the reaper locks the owners' rows with SKIP LOCKED; the capacity of an owner it
--   cannot lock is not given back now but recounted by a later pass (from the jobs
--   themselves, as a restarted runner's registration does), so its jobs are requeued on
--   time regardless; until the recount, that runner's counters overstate what it uses,
--   which can only make it claim less, never oversubscribe;
-- - the heartbeat renews its leases, then marks the runner alive only if its row is
--   free at that moment (the next beat does it otherwise).

-- No foreign key: checking one takes a share lock on the runner's row, the very lock
-- this table exists not to wait for.
CREATE TABLE fleetq.recount (
    runner_id  text PRIMARY KEY,
    since      timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Set the reserved capacity of runners owed a recount to what their jobs hold, for
-- those whose row is free now (the rest wait for a later pass).
CREATE FUNCTION fleetq.recount_reservations() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_ids text[];
BEGIN
    SELECT array_agg(r.id) INTO v_ids
    FROM (SELECT r.id FROM fleetq.runners r JOIN fleetq.recount c ON c.runner_id = r.id
          ORDER BY r.id FOR UPDATE OF r SKIP LOCKED) r;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    UPDATE fleetq.runners r
    SET reserved_memory_mb = coalesce(h.memory, 0), reserved_cpu_millis = coalesce(h.cpu, 0)
    FROM unnest(v_ids) AS i(id)
    LEFT JOIN (SELECT reserved_on, sum(memory_mb)::integer AS memory,
                      sum(cpu_millis)::integer AS cpu
               FROM fleetq.jobs WHERE reserved_on = ANY (v_ids) GROUP BY reserved_on) h
           ON h.reserved_on = i.id
    WHERE r.id = i.id;
    UPDATE fleetq.runner_lanes l
    SET slots_used = (SELECT count(*) FROM fleetq.jobs j
                      WHERE j.reserved_on = l.runner_id AND j.lane = l.lane)
    WHERE l.runner_id = ANY (v_ids);
    DELETE FROM fleetq.recount WHERE runner_id = ANY (v_ids);
    RETURN cardinality(v_ids);
END;
$$;

CREATE OR REPLACE FUNCTION fleetq.reap_unchecked(p_limit integer DEFAULT 1000, p_now timestamptz DEFAULT NULL)
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
    v_free text[];
BEGIN
    IF NOT pg_try_advisory_xact_lock(7365657071) THEN  -- "reaper": one leader per moment
        RETURN QUERY SELECT 0, 0, false;
        RETURN;
    END IF;
    PERFORM fleetq.recount_reservations();
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
    -- Give back what the owners it can lock now reserved; an owner whose row another
    -- transaction holds is recounted by a later pass instead of waited for.
    SELECT array_agg(r.id) INTO v_free
    FROM (SELECT r.id FROM fleetq.runners r WHERE r.id = ANY (v_owners)
          ORDER BY r.id FOR UPDATE SKIP LOCKED) r;
    PERFORM fleetq.give_back(array_agg(t.owner), array_agg(t.lane), array_agg(t.memory),
                             array_agg(t.cpu))
    FROM unnest(v_owners, v_lanes, v_memory, v_cpu) AS t(owner, lane, memory, cpu)
    WHERE t.owner = ANY (coalesce(v_free, '{}'));
    INSERT INTO fleetq.recount (runner_id)
    SELECT DISTINCT t.owner FROM unnest(v_owners) AS t(owner)
    WHERE t.owner IS NOT NULL AND t.owner <> ALL (coalesce(v_free, '{}'))
    ON CONFLICT DO NOTHING;
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

CREATE OR REPLACE FUNCTION fleetq.heartbeat_unchecked(p_runner text, p_jobs bigint[], p_versions bigint[])
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

    -- The runner is alive; a draining runner with nothing left is drained. Not waited
    -- for: if another transaction holds the runner's row (its own handler committing an
    -- outcome, a claim), the leases above are what matter, and the next beat says alive.
    UPDATE fleetq.runners r
    SET last_heartbeat_at = clock_timestamp(),
        state = CASE WHEN r.state = 'draining' AND NOT EXISTS
                         (SELECT 1 FROM fleetq.jobs j WHERE j.reserved_on = p_runner)
                     THEN 'drained' ELSE r.state END,
        state_changed_at = CASE WHEN r.state = 'draining' AND NOT EXISTS
                         (SELECT 1 FROM fleetq.jobs j WHERE j.reserved_on = p_runner)
                     THEN clock_timestamp() ELSE r.state_changed_at END
    WHERE r.id = (SELECT x.id FROM fleetq.runners x WHERE x.id = p_runner
                  FOR UPDATE SKIP LOCKED);

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
