-- Protocol: the claim: eligibility (lane, capabilities, requested node, state, slots, memory,
-- CPU: all checked before a job is taken) and the claim itself, which takes queued jobs
-- with FOR NO KEY UPDATE SKIP LOCKED, reserves capacity and grants a new fencing token.
--
-- Applied by `fleetq migrate` whenever this file changes (CREATE OR REPLACE; every
-- changed protocol file in one transaction). Change a function here; tables, dropped
-- functions and new signatures go in a numbered migration.

-- The claim's filter: ineligibility(...) IS NULL, in plpgsql on purpose. An inlined
-- expression would be estimated to pass 0.5% of rows, and the planner would then read
-- and sort a whole lane instead of walking jobs_queued in order and stopping at the
-- limit; an opaque boolean function is estimated at 1/3, which keeps the ordered index
-- scan (test_query_plans.py checks it).
CREATE OR REPLACE FUNCTION fleetq.eligible(j_capabilities text[], j_requested_node text, j_memory_mb integer, j_cpu_millis integer, r_node text, r_capabilities text[], r_state text, r_offline boolean, r_free_memory_mb integer, r_free_cpu_millis integer, l_slots integer, l_slots_used integer)
 RETURNS boolean
 LANGUAGE plpgsql
 IMMUTABLE PARALLEL SAFE
AS $function$
BEGIN
    RETURN fleetq.ineligibility(j_capabilities, j_requested_node, j_memory_mb, j_cpu_millis,
                                r_node, r_capabilities, r_state, r_offline, r_free_memory_mb,
                                r_free_cpu_millis, l_slots, l_slots_used) IS NULL;
END;
$function$;

-- THE eligibility rule (DESIGN §3 "match before claim"): NULL when a runner can take the
-- job now, else the first failing reason. The claim filters on it and `explain` reports
-- it, so the two cannot disagree. Permanent reasons come first (the runner could never
-- run the job), then the runner's state, then capacity that may free up.
CREATE OR REPLACE FUNCTION fleetq.ineligibility(j_capabilities text[], j_requested_node text, j_memory_mb integer, j_cpu_millis integer, r_node text, r_capabilities text[], r_state text, r_offline boolean, r_free_memory_mb integer, r_free_cpu_millis integer, l_slots integer, l_slots_used integer)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT CASE
        WHEN l_slots IS NULL THEN 'lane'
        WHEN NOT (j_capabilities <@ r_capabilities) THEN 'capability'
        WHEN j_requested_node IS NOT NULL AND j_requested_node <> r_node THEN 'node'
        WHEN r_offline OR r_state = 'offline' THEN 'offline'
        WHEN r_state <> 'active' THEN r_state
        WHEN l_slots_used >= l_slots THEN 'slots'
        WHEN j_memory_mb > r_free_memory_mb THEN 'memory'
        WHEN j_cpu_millis > r_free_cpu_millis THEN 'cpu'
    END
$function$;

-- Announce one new queued job (a submit's wake-up). Every runner of a lane LISTENs, and
-- a wake-up that names only the lane makes each of them claim, though one takes the job:
-- with n runners, n - 1 claims find nothing, each a round trip and a plpgsql call on both
-- sides. So the runner that can take the job now and has the most room left in its lane
-- (ties at random) is named after the lane, "lane runner", and only it claims; the others
-- look once, a poll interval later, in case it died before claiming (fleetq/runner/
-- control.py). When no runner can take the job now, the lane is named alone: the job waits
-- for room, and a runner that frees some claims again anyway.
CREATE OR REPLACE FUNCTION fleetq.announce_job(p_job bigint)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_lane text;
    v_runner text;
BEGIN
    SELECT j.lane,
           (SELECT rl.runner_id
            FROM fleetq.runner_lanes rl JOIN fleetq.runners r ON r.id = rl.runner_id
            WHERE rl.lane = j.lane
              AND fleetq.ineligibility(j.capabilities, j.requested_node, j.memory_mb,
                                       j.cpu_millis, r.node, r.capabilities, r.state,
                                       fleetq.runner_is_stale(r.last_heartbeat_at),
                                       r.memory_mb - r.reserved_memory_mb,
                                       r.cpu_millis - r.reserved_cpu_millis,
                                       rl.slots, rl.slots_used) IS NULL
            ORDER BY rl.slots_used::float8 / rl.slots, random()
            LIMIT 1)
    INTO v_lane, v_runner
    FROM fleetq.jobs j WHERE j.id = p_job;
    PERFORM pg_notify('fleetq_work', concat_ws(' ', v_lane, v_runner));
END;
$function$;

-- The room fleet-wide caps (migration 0016) leave in a lane: the lane's own (NULL: no
-- cap), and each capped project's, with the projects that have none left. p_lock takes the
-- capped lane's row and every capped project's first (NO KEY UPDATE: submits, whose
-- foreign keys take KEY SHARE, are not held up), so claims under one cap run one at a
-- time and each counts what the one before committed; unlocked, it is only the claim's
-- first estimate, which chooses the jobs to hold.
CREATE OR REPLACE FUNCTION fleetq.claim_rooms(p_lane text, p_lane_cap integer, p_project_caps boolean, p_lock boolean, OUT lane_room bigint, OUT cap_projects text[], OUT cap_rooms bigint[], OUT full_projects text[])
 RETURNS record
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF p_lane_cap IS NOT NULL THEN
        IF p_lock THEN
            PERFORM 1 FROM fleetq.lanes WHERE name = p_lane FOR NO KEY UPDATE;
        END IF;
        SELECT greatest(0, p_lane_cap - count(*)) INTO lane_room
        FROM fleetq.jobs WHERE reserved_on IS NOT NULL AND lane = p_lane;
    END IF;
    IF p_project_caps THEN
        IF p_lock THEN
            PERFORM 1 FROM fleetq.projects WHERE max_running IS NOT NULL
            ORDER BY name FOR NO KEY UPDATE;
        END IF;
        SELECT array_agg(p.name), array_agg(greatest(0, p.max_running - coalesce(c.n, 0)))
        INTO cap_projects, cap_rooms
        FROM fleetq.projects p
        LEFT JOIN (SELECT j.project, count(*) AS n FROM fleetq.jobs j
                   WHERE j.reserved_on IS NOT NULL GROUP BY j.project) c
               ON c.project = p.name
        WHERE p.max_running IS NOT NULL;
        SELECT array_agg(t.project) INTO full_projects
        FROM unnest(cap_projects, cap_rooms) AS t(project, room) WHERE t.room = 0;
    END IF;
END;
$function$;

-- What a claim takes of the jobs it holds, under its runner's lock: stage two of
-- fleetq.claim_unchecked, a function of its own for its plan. Planned for each call's own
-- values it costs more to plan than to run, and whether PostgreSQL kept a generic plan or
-- planned again on every call turned on the costs it saw in its first five calls (taking
-- one statement out of the claim flipped it). It probes the held jobs by key whatever the
-- values, so the generic plan is always the right one, and forced here. Stage one, the
-- walk over jobs_queued, is left to PostgreSQL (its generic plan sorted the whole lane:
-- test_query_plans.py).
CREATE OR REPLACE FUNCTION fleetq.claim_take(p_runner text, p_lane text, p_limit integer, p_claim_id uuid, p_held bigint[], p_node text, p_capabilities text[], p_state text, p_offline boolean, p_free_memory integer, p_free_cpu integer, p_slots integer, p_slots_used integer, p_lane_room bigint, p_cap_projects text[], p_cap_rooms bigint[], p_full_projects text[], p_lease interval)
 RETURNS TABLE(job_id bigint, lease_version bigint, lease_expires_at timestamp with time zone, project text, operation text, commit_sha text, requested_node text, payload jsonb, task_id text, timeout_s integer, memory_mb integer, cpu_millis integer, priority_class smallint, reassign_count integer, lost_count smallint, traceparent text)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH candidates AS (
        -- The held jobs that still qualify under the lock, in priority order.
        SELECT j.id, j.project, j.memory_mb, j.cpu_millis, j.priority_class, j.created_at
        FROM fleetq.jobs j
        WHERE j.id = ANY (p_held)
          AND fleetq.eligible(j.capabilities, j.requested_node, j.memory_mb, j.cpu_millis,
                              p_node, p_capabilities, p_state, p_offline, p_free_memory,
                              p_free_cpu, p_slots, p_slots_used)
          AND j.project <> ALL (coalesce(p_full_projects, '{}'))
        ORDER BY j.priority_class, j.created_at, j.id
        LIMIT least(p_limit, coalesce(p_slots - p_slots_used, 0), coalesce(p_lane_room, p_limit))
    ),
    capped AS (
        -- Within each capped project's room (a project not capped has none to keep to).
        SELECT c.*
        FROM (SELECT c.*, row_number() OVER (PARTITION BY c.project
                                             ORDER BY c.priority_class, c.created_at, c.id) AS n
              FROM candidates c) c
        LEFT JOIN unnest(p_cap_projects, p_cap_rooms) AS cap(project, room)
               ON cap.project = c.project
        WHERE cap.room IS NULL OR c.n <= cap.room
    ),
    fitting AS (
        -- Each candidate fits alone; together only a prefix may: keep the prefix whose
        -- running totals fit, so the batch never over-reserves.
        SELECT c.id,
               sum(c.memory_mb) OVER w AS memory_total,
               sum(c.cpu_millis) OVER w AS cpu_total
        FROM capped c
        WINDOW w AS (ORDER BY c.priority_class, c.created_at, c.id)
    ),
    taken AS (
        UPDATE fleetq.jobs j
        SET state = 'claimed',
            lease_owner = p_runner,
            reserved_on = p_runner,
            lease_version = j.lease_version + 1,
            lease_expires_at = clock_timestamp() + p_lease,
            claim_id = p_claim_id,
            claimed_at = clock_timestamp(),
            updated_at = clock_timestamp()
        FROM fitting f
        WHERE j.id = f.id AND f.memory_total <= p_free_memory AND f.cpu_total <= p_free_cpu
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
          AND (t.memory <> 0 OR t.cpu <> 0)  -- nothing to reserve: no write (as give_back)
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
    )
    -- An in-process handler starts now, yet its execution is no row until its lease
    -- ends (fleetq.record_handler_runs): till then the job's row is its record.
    SELECT t.id, t.lease_version, t.lease_expires_at, t.project, t.operation, t.commit_sha,
           t.requested_node, t.payload, t.task_id, t.timeout_s, t.memory_mb, t.cpu_millis,
           t.priority_class, t.reassign_count, t.lost_count, t.traceparent
    FROM taken t
    ORDER BY t.priority_class, t.created_at, t.id;
END;
$function$;

-- What a claim reads of its runner and lane: the runner's eligibility facts (node,
-- capabilities, state, staleness, free memory and CPUs), the lane's slots, and the room
-- fleet-wide caps leave (fleetq.claim_rooms). Read twice by fleetq.claim_unchecked: once
-- unlocked, to choose the jobs to hold, and once under the runner's row lock (p_lock), to
-- take what still fits. Staleness is read here once, not inside the scan per job.
CREATE OR REPLACE FUNCTION fleetq.claim_standing(p_runner text, p_lane text, p_lock boolean, OUT node text, OUT capabilities text[], OUT state text, OUT offline boolean, OUT free_memory integer, OUT free_cpu integer, OUT slots integer, OUT slots_used integer, OUT lane_room bigint, OUT cap_projects text[], OUT cap_rooms bigint[], OUT full_projects text[])
 RETURNS record
 LANGUAGE plpgsql
AS $function$
DECLARE
    r fleetq.runners%ROWTYPE;
    l record;  -- slots, slots_used, lane_cap, project_caps
BEGIN
    IF p_lock THEN
        SELECT * INTO r FROM fleetq.runners WHERE id = p_runner FOR UPDATE;
    ELSE
        SELECT * INTO r FROM fleetq.runners WHERE id = p_runner;
    END IF;
    IF NOT FOUND THEN  -- never registered, or forgotten since the unlocked read
        RAISE EXCEPTION 'unknown runner %', p_runner USING ERRCODE = 'FQ004';
    END IF;
    SELECT rl.slots, rl.slots_used, ln.max_running AS lane_cap,
           EXISTS (SELECT 1 FROM fleetq.projects p WHERE p.max_running > 0) AS project_caps
    INTO l
    FROM fleetq.runner_lanes rl JOIN fleetq.lanes ln ON ln.name = rl.lane
    WHERE rl.runner_id = p_runner AND rl.lane = p_lane;
    node := r.node;
    capabilities := r.capabilities;
    state := r.state;
    offline := fleetq.runner_is_stale(r.last_heartbeat_at);
    free_memory := r.memory_mb - r.reserved_memory_mb;
    free_cpu := r.cpu_millis - r.reserved_cpu_millis;
    slots := l.slots;
    slots_used := l.slots_used;
    IF l.lane_cap IS NOT NULL OR l.project_caps THEN
        SELECT * INTO lane_room, cap_projects, cap_rooms, full_projects
        FROM fleetq.claim_rooms(p_lane, l.lane_cap, l.project_caps, p_lock);
    END IF;
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.claim_unchecked(p_runner text, p_lane text, p_limit integer, p_claim_id uuid)
 RETURNS TABLE(job_id bigint, lease_version bigint, lease_expires_at timestamp with time zone, project text, operation text, commit_sha text, requested_node text, payload jsonb, task_id text, timeout_s integer, memory_mb integer, cpu_millis integer, priority_class smallint, reassign_count integer, lost_count smallint, traceparent text)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    s record;                    -- fleetq.claim_standing: the runner's and lane's facts
    v_held bigint[];             -- the queued jobs this claim holds (row locks)
    v_taken integer;
    v_lease interval := fleetq.setting_seconds('lease_seconds');
BEGIN
    -- A retried claim (its reply was lost after commit) gets back what it took, instead
    -- of leaving those jobs stranded until their lease expires.
    IF EXISTS (SELECT 1 FROM fleetq.jobs j
               WHERE j.claim_id = p_claim_id AND j.state IN ('claimed', 'running')) THEN
        RETURN QUERY
        SELECT j.id, j.lease_version, j.lease_expires_at, j.project, j.operation, j.commit_sha,
               j.requested_node, j.payload, j.task_id, j.timeout_s, j.memory_mb, j.cpu_millis,
               j.priority_class, j.reassign_count, j.lost_count, j.traceparent
        FROM fleetq.jobs j
        WHERE j.claim_id = p_claim_id AND j.lease_owner = p_runner
          AND j.state IN ('claimed', 'running')
        ORDER BY j.priority_class, j.created_at, j.id;
        RETURN;
    END IF;

    -- A claim holds its jobs before it locks its runner's row: a claim that finds
    -- nothing, or loses the race for what it found, writes nothing. Most wake-ups are
    -- such: a submit's NOTIFY wakes every runner of its lane, one takes the job, the
    -- others find it held or gone. Every row lock is a write (a transaction id, WAL, a
    -- dirtied page), and locking the runner's row first made each of those wake-ups one.
    -- So the jobs are chosen on what the runner's rows say now, unlocked, and held with
    -- FOR NO KEY UPDATE SKIP LOCKED (SKIP LOCKED: a row another claimer holds is skipped,
    -- not waited for, so an empty answer does not prove the queue is empty). A held job
    -- waits on nothing: it is held only by this claim until it commits. NO KEY: a claim
    -- changes no key, and the lock a foreign key takes (KEY SHARE: a `submit --after`
    -- naming this job holds it until it commits) does not conflict with it; FOR UPDATE
    -- did, and the claim skipped the job, which then waited for a poll (nothing
    -- announces it again when that submit commits).
    s := fleetq.claim_standing(p_runner, p_lane, false);
    WITH candidates AS (
        -- Eligible queued jobs in priority order: an index scan on jobs_queued that stops
        -- at the limit.
        SELECT j.id
        FROM fleetq.jobs j
        WHERE j.state = 'queued' AND j.lane = p_lane
          AND fleetq.eligible(j.capabilities, j.requested_node, j.memory_mb, j.cpu_millis,
                              s.node, s.capabilities, s.state, s.offline, s.free_memory,
                              s.free_cpu, s.slots, s.slots_used)
          AND j.project <> ALL (coalesce(s.full_projects, '{}'))
        ORDER BY j.priority_class, j.created_at, j.id
        LIMIT least(p_limit, coalesce(s.slots - s.slots_used, 0), coalesce(s.lane_room, p_limit))
        FOR NO KEY UPDATE SKIP LOCKED
    )
    SELECT array_agg(c.id) INTO v_held FROM candidates c;
    IF v_held IS NULL THEN
        RETURN;
    END IF;

    -- Claims of one runner serialize on its row, so the free capacity read here is still
    -- free when the reservation below is written; the held jobs are taken as far as it
    -- goes.
    s := fleetq.claim_standing(p_runner, p_lane, true);

    RETURN QUERY
    SELECT * FROM fleetq.claim_take(p_runner, p_lane, p_limit, p_claim_id, v_held, s.node,
                                    s.capabilities, s.state, s.offline, s.free_memory,
                                    s.free_cpu, s.slots, s.slots_used, s.lane_room,
                                    s.cap_projects, s.cap_rooms, s.full_projects, v_lease);

    GET DIAGNOSTICS v_taken = ROW_COUNT;

    -- Other runners are told to look when this claim leaves jobs they could take: jobs it
    -- held and did not take (its room shrank, a cap filled meanwhile), which they skipped
    -- while they were held; or jobs still queued once it filled its room, which may have
    -- been announced to this runner alone (fleetq.announce_job), while another runner of
    -- the lane is idle. Not merely one with room: under a backlog runners free and fill
    -- slots all the time, and a NOTIFY per claim (notifying commits run one at a time)
    -- held 100 runners up for nothing. Nor from a refill (the claim an outcome batch
    -- carries, fleetq.complete_and_claim): a runner refilling is draining a backlog, whose
    -- submits woke the lane already, and with many runners some are always idle for an
    -- instant, so nearly every refill would notify (docs/decisions/ has the measurement).
    -- (Tested in this order, a refill reads nothing; the tests that read are a query of
    -- their own, which PostgreSQL planned again on every call while it was one with the
    -- rest.)
    IF v_taken < cardinality(v_held) THEN
        PERFORM pg_notify('fleetq_work', p_lane);
    ELSIF v_taken = s.slots - s.slots_used
          AND current_setting('fleetq.refill', true) IS DISTINCT FROM 'on' THEN
        IF EXISTS (SELECT 1 FROM fleetq.runner_lanes rl
                   WHERE rl.lane = p_lane AND rl.runner_id <> p_runner AND rl.slots_used = 0)
           AND EXISTS (SELECT 1 FROM fleetq.jobs j WHERE j.state = 'queued' AND j.lane = p_lane)
        THEN
            PERFORM pg_notify('fleetq_work', p_lane);
        END IF;
    END IF;
END;
$function$;

-- ---------------------------------------------------------------------------------------
-- Runner entry points: the runner is the caller's own.
CREATE OR REPLACE FUNCTION fleetq.claim(p_runner text, p_lane text, p_limit integer, p_claim_id uuid)
 RETURNS TABLE(job_id bigint, lease_version bigint, lease_expires_at timestamp with time zone, project text, operation text, commit_sha text, requested_node text, payload jsonb, task_id text, timeout_s integer, memory_mb integer, cpu_millis integer, priority_class smallint, reassign_count integer, lost_count smallint, traceparent text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN  -- plpgsql: its statement is planned once per connection, not on every call
    RETURN QUERY
    SELECT * FROM fleetq.claim_unchecked(fleetq.acting_runner(p_runner), p_lane, p_limit,
                                         p_claim_id);
END;
$function$;
