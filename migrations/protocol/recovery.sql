-- Protocol: Recovery of expired leases by one reaper leader at a time (requeue or fail after the
-- reassignment cap), recounting capacity it could not give back at once, and the
-- queue history the leader samples.
--
-- Applied by `fleetq migrate` whenever this file changes (CREATE OR REPLACE; every
-- changed protocol file in one transaction). Change a function here; tables, dropped
-- functions and new signatures go in a numbered migration.

-- Set the reserved capacity of runners owed a recount to what their jobs hold, for
-- those whose row is free now (the rest wait for a later pass), and wake their lanes.
CREATE OR REPLACE FUNCTION fleetq.recount_reservations()
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
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
    -- The room given back was announced by nothing else: wake those runners' lanes, or a
    -- job that waited for it waits for a poll (up to --poll-max).
    PERFORM pg_notify('fleetq_work', l.lane)
    FROM (SELECT DISTINCT lane FROM fleetq.runner_lanes WHERE runner_id = ANY (v_ids)) l;
    DELETE FROM fleetq.recount WHERE runner_id = ANY (v_ids);
    RETURN cardinality(v_ids);
END;
$function$;

-- A session that has held the reaper's row for 30 s is ended. A pass holds the rows it
-- took till its transaction ends (expired jobs, their runners' rows, promoted jobs),
-- and a runner login calling reap in a transaction it kept open held them for as long
-- as it liked: another runner's claims and outcomes waited on its own row. Ending the
-- session releases them all; a runner's own session (a leader stopped mid-pass, say)
-- reconnects as after any lost connection. The holder is the transaction that locked
-- the row (its xmax), found in pg_locks, and judged by its transaction's start. This
-- needs the right to see and signal other sessions (a superuser, or pg_read_all_stats
-- and pg_signal_backend granted to the owner of fleetq's functions); without it the
-- holder keeps what it took, and expiry goes on without a leader around it.
CREATE OR REPLACE FUNCTION fleetq.end_stuck_pass(p_now timestamp with time zone)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_pid integer;
    v_since timestamptz;
BEGIN
    SELECT l.pid, a.xact_start INTO v_pid, v_since
    FROM pg_catalog.pg_locks l
    JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
      AND l.transactionid = (SELECT c.xmax FROM fleetq.coordination c WHERE c.name = 'reaper')
      AND l.pid <> pg_backend_pid()
      AND a.xact_start < p_now - interval '30 seconds';
    IF v_pid IS NULL THEN
        RETURN 0;
    END IF;
    BEGIN
        PERFORM pg_terminate_backend(v_pid, 5000);  -- gone, with its locks, on return
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE WARNING 'fleetq: session % has held the reaper''s pass open since %; '
                      'not ended: %', v_pid, v_since, SQLERRM;
        RETURN 0;
    END;
    RAISE WARNING 'fleetq: ended session %: it held the reaper''s pass open since %',
                  v_pid, v_since;
    RETURN 1;
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.reap_unchecked(p_limit integer DEFAULT 1000, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone)
 RETURNS TABLE(requeued integer, failed integer, leader boolean)
 LANGUAGE plpgsql
AS $function$
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
    v_expired bigint[];
    v_reserved text[];
    v_leader boolean;
BEGIN
    -- One leader per moment: the reaper's row, locked to the end of the pass, dated by
    -- each pass. A row lock needs UPDATE on the table, which only fleetq's functions have
    -- (an advisory key was anyone's: a reader holding it stalled expiry, schedules,
    -- samples and retries).
    PERFORM 1 FROM fleetq.coordination WHERE name = 'reaper' FOR UPDATE SKIP LOCKED;
    v_leader := FOUND;
    IF v_leader THEN
        UPDATE fleetq.coordination SET taken_at = clock_timestamp() WHERE name = 'reaper';
        -- A pass leads at its transaction's top level only: in a savepoint released
        -- after it, the row's holder is a subtransaction that pg_locks no longer names,
        -- and end_stuck_pass could not find it to end it.
        IF (SELECT c.xmin FROM fleetq.coordination c WHERE c.name = 'reaper')
               <> xid(pg_current_xact_id()) THEN
            RAISE EXCEPTION 'the reaper''s pass runs at a transaction''s top level, not in '
                            'a savepoint or an exception block'
                USING ERRCODE = 'FQ003';
        END IF;
        PERFORM fleetq.recount_reservations();
    ELSIF EXISTS (SELECT 1 FROM fleetq.coordination WHERE name = 'reaper'
                  AND taken_at > clock_timestamp() - interval '10 seconds') THEN
        RETURN QUERY SELECT 0, 0, false;
        RETURN;
    ELSE
        PERFORM fleetq.end_stuck_pass(coalesce(p_now, clock_timestamp()));
    END IF;
    -- Past here without the row, no pass has ended in 10 s: a runner login can call reap
    -- in a transaction it keeps open and hold the row. Expiry goes on without a leader
    -- (each expired lease is taken by one reaper: SKIP LOCKED below); the leader's other
    -- duties (recounts, samples, retries) wait for a leader, or for the holder's end.
    SELECT array_agg(e.id), array_agg(e.reserved_on) INTO v_expired, v_reserved
    FROM (SELECT j.id, j.reserved_on
          FROM fleetq.jobs j
          WHERE j.state IN ('claimed', 'running')
            AND j.lease_expires_at < coalesce(p_now, clock_timestamp())
            -- nor renewed while its row was held (heartbeat_unchecked, `busy`)
            AND NOT EXISTS (SELECT 1 FROM fleetq.busy_renewals b
                            WHERE b.job_id = j.id AND b.lease_version = j.lease_version
                              AND b.lease_expires_at >= coalesce(p_now, clock_timestamp()))
          ORDER BY j.lease_expires_at, j.id
          LIMIT p_limit
          FOR NO KEY UPDATE SKIP LOCKED) e;
    IF v_expired IS NULL THEN
        RETURN QUERY SELECT 0, 0, v_leader;
        RETURN;
    END IF;
    -- a handler may run on past its lease (frozen): its execution is recorded open now,
    -- while its job's row still names it, so its overlap with the next token shows
    PERFORM fleetq.record_handler_runs(v_expired);
    WITH moved AS (
        UPDATE fleetq.jobs j
        SET state = CASE WHEN j.reassign_count + 1 > v_cap THEN 'failed' ELSE 'queued' END,
            failure_reason = CASE WHEN j.reassign_count + 1 > v_cap
                                  THEN 'reassignments_exhausted' END,
            finished_at = CASE WHEN j.reassign_count + 1 > v_cap THEN clock_timestamp() END,
            reassign_count = j.reassign_count + 1,
            lease_owner = NULL, lease_expires_at = NULL, reserved_on = NULL, claim_id = NULL,
            updated_at = clock_timestamp()
        FROM unnest(v_expired, v_reserved) AS e(id, reserved_on)
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
        RETURN QUERY SELECT 0, 0, v_leader;
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
    PERFORM pg_notify('fleetq_work', lane) FROM (SELECT DISTINCT unnest(v_lanes) AS lane) l;
    RETURN QUERY SELECT cardinality(v_ids) - coalesce(cardinality(v_failed), 0),
                        coalesce(cardinality(v_failed), 0), v_leader;
END;
$function$;

-- The leader samples after its pass (a runner may lead; only an administrator may move
-- the clock, which the sample then follows, so tests write history without sleeping).
CREATE OR REPLACE FUNCTION fleetq.reap(p_limit integer DEFAULT 1000, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone)
 RETURNS TABLE(requeued integer, failed integer, leader boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    c record;
    v record;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['runner']);
    IF p_now IS NOT NULL AND c.kind <> 'admin' THEN
        RAISE EXCEPTION 'only an administrator may reap at another time'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT * INTO v FROM fleetq.reap_unchecked(p_limit, p_now);
    IF v.leader THEN
        PERFORM fleetq.sample_queues(p_now);
        PERFORM fleetq.promote_waiting(p_now);
        PERFORM fleetq.queue_due_retries(p_now);
        PERFORM fleetq.settle_pending();
    END IF;
    RETURN QUERY SELECT v.requeued, v.failed, v.leader;
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.sample_queues(p_now timestamp with time zone DEFAULT NULL::timestamp with time zone)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_minute timestamptz := date_trunc('minute', v_now);
    v_rows integer := 0;
BEGIN
    IF EXISTS (SELECT 1 FROM fleetq.queue_samples WHERE at = v_minute) THEN
        RETURN 0;  -- every pass but the minute's first stops here: one index probe
    END IF;
    BEGIN  -- a sample that fails costs the sample, never the reaper's pass
        WITH since AS (  -- the claims of the minute before, found as views_queue_wait does
            SELECT coalesce(max(id), 0) AS id
            FROM fleetq.events
            WHERE at < v_minute - interval '1 minute'
        ),
        waits AS (
            SELECT j.lane, j.priority_class, count(*) AS claimed,
                   percentile_cont(0.5) WITHIN GROUP
                       (ORDER BY extract(epoch FROM e.at - j.created_at)) AS p50_s,
                   max(extract(epoch FROM e.at - j.created_at)) AS max_s
            FROM since
            JOIN fleetq.events e ON e.id > since.id
            JOIN fleetq.jobs j ON j.id = e.job_id
            WHERE e.kind = 'claimed'
              AND e.at >= v_minute - interval '1 minute' AND e.at < v_minute
            GROUP BY j.lane, j.priority_class
        ),
        depth AS (
            SELECT lane, priority_class, count(*) AS queued, min(created_at) AS oldest
            FROM fleetq.jobs
            WHERE state = 'queued'
            GROUP BY lane, priority_class
        )
        INSERT INTO fleetq.queue_samples
            (at, lane, priority_class, queued, oldest_wait_s, claimed, wait_p50_s, wait_max_s)
        SELECT v_minute, l.name, c.class, coalesce(d.queued, 0),
               greatest(0, extract(epoch FROM v_now - d.oldest)),
               coalesce(w.claimed, 0), w.p50_s, w.max_s
        FROM fleetq.lanes l
        CROSS JOIN (VALUES (0::smallint), (1::smallint), (2::smallint)) AS c(class)
        LEFT JOIN depth d ON d.lane = l.name AND d.priority_class = c.class
        LEFT JOIN waits w ON w.lane = l.name AND w.priority_class = c.class
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        DELETE FROM fleetq.queue_samples WHERE at < v_minute - interval '7 days';
    EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'fleetq: queue sample of % not written: %', v_minute, SQLERRM;
        RETURN 0;
    END;
    RETURN v_rows;
END;
$function$;

-- Aging, opt-in (settings.aging_promote_after_seconds; NULL, the default, is off and
-- costs one settings read): a queued job that has waited the set time since its submit is
-- promoted one class, and again after each further such wait, up to class 0, so a class
-- under sustained higher-class load is not starved for ever. Run by the reaper's leader;
-- each lane and class is read oldest first along jobs_queued, rows a claim holds are
-- skipped, and a failure costs the promotion, never the reaper's pass. The rows it reads
-- it holds till the pass commits, and a claim meanwhile skips them and may find nothing:
-- so the lanes whose jobs it held are woken as it commits (else their runners looked
-- again only at their next poll, up to --poll-max away).
CREATE OR REPLACE FUNCTION fleetq.promote_waiting(p_now timestamp with time zone DEFAULT NULL)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_after integer := fleetq.setting_int('aging_promote_after_seconds');
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_ids bigint[];
    v_classes smallint[];
    v_lanes text[];
BEGIN
    IF v_after IS NULL THEN
        RETURN 0;
    END IF;
    BEGIN
        WITH held AS (
            SELECT j.id, j.promotions, j.created_at, l.name AS lane
            FROM fleetq.lanes l
            CROSS JOIN (VALUES (1::smallint), (2::smallint)) AS c(class)
            CROSS JOIN LATERAL (
                SELECT q.id, q.promotions, q.created_at
                FROM fleetq.jobs q
                WHERE q.state = 'queued' AND q.lane = l.name AND q.priority_class = c.class
                  AND q.created_at < v_now - make_interval(secs => v_after)
                ORDER BY q.created_at, q.id
                LIMIT 1000
                FOR NO KEY UPDATE OF q SKIP LOCKED
            ) j
        ),
        due AS (
            SELECT h.id FROM held h
            WHERE h.created_at < v_now - make_interval(secs => v_after * (h.promotions + 1))
        ),
        moved AS (
            UPDATE fleetq.jobs j
            SET priority_class = j.priority_class - 1, promotions = j.promotions + 1,
                updated_at = clock_timestamp()
            FROM due WHERE j.id = due.id
            RETURNING j.id, j.priority_class
        )
        SELECT array_agg(m.id ORDER BY m.id), array_agg(m.priority_class ORDER BY m.id),
               (SELECT array_agg(DISTINCT h.lane) FROM held h)
        INTO v_ids, v_classes, v_lanes FROM moved m;
        PERFORM pg_notify('fleetq_work', t.lane) FROM unnest(v_lanes) AS t(lane);
        IF v_ids IS NOT NULL THEN
            INSERT INTO fleetq.events (kind, job_id, lease_version, actor, detail)
            SELECT 'promoted', t.id, 0, 'fleetq',
                   jsonb_build_object('priority_class', t.class, 'waited_s', v_after)
            FROM unnest(v_ids, v_classes) AS t(id, class);
        END IF;
    EXCEPTION WHEN OTHERS THEN
        RAISE WARNING 'fleetq: aging skipped this pass: %', SQLERRM;
        RETURN 0;
    END;
    RETURN coalesce(cardinality(v_ids), 0);
END;
$function$;
