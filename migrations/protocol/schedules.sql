-- Protocol: schedules. The runners of a schedule's lane (migration 0031) compute its due
-- ticks in Python (cronsim, in the schedule's time zone) and settle each here: fired (the
-- tick's row and the job's submit in one transaction, so a tick fires once whoever fires
-- it) or skipped by the catch-up rule, one runner a tick taking its turn first.
-- Operators pause and resume, with a reason.
--
-- Applied by `fleetq migrate` whenever this file changes (CREATE OR REPLACE; every
-- changed protocol file in one transaction). Change a function here; tables, dropped
-- functions and new signatures go in a numbered migration.

-- A runner settles only ticks that are due: a whole minute (cron's resolution) that has
-- come. A runner login skipped a schedule to 'infinity' (silenced for good) and could
-- fire a tick every second; an administrator may name any time (tests, repairs).
CREATE OR REPLACE FUNCTION fleetq.refuse_undue_tick(p_tick timestamptz)
 RETURNS void
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
    IF p_tick IS NULL OR NOT isfinite(p_tick) OR p_tick > clock_timestamp()
       OR p_tick <> date_trunc('minute', p_tick) THEN
        RAISE EXCEPTION 'tick % is not a due minute', p_tick
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END;
$function$;

-- A runner login settles only the schedules of a lane its runner serves: a runner of the
-- lane decides that lane's outcomes already, one of another lane (another tenant's)
-- decides nothing of theirs. Any runner once fired a branch schedule's tick at a commit
-- of its choosing. No schedule of that name: nothing to refuse (the caller finds none).
CREATE OR REPLACE FUNCTION fleetq.refuse_schedule_of_other_lanes(p_runner text, p_name text)
 RETURNS void
 LANGUAGE plpgsql
 STABLE
AS $function$
DECLARE
    v_lane text;
BEGIN
    SELECT o.lane INTO v_lane
    FROM fleetq.schedules s
    JOIN fleetq.operations o ON o.project = s.project AND o.name = s.operation
    WHERE s.name = p_name;
    IF FOUND AND NOT EXISTS (SELECT 1 FROM fleetq.runner_lanes l
                             WHERE l.runner_id = p_runner AND l.lane = v_lane) THEN
        RAISE EXCEPTION 'schedule % is lane %''s, which runner % does not serve', p_name,
                        v_lane, p_runner
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.fire_schedule(p_name text, p_tick timestamptz, p_commit text)
 RETURNS TABLE(job_id bigint, fired boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    c record;
    s fleetq.schedules%ROWTYPE;
    v_job bigint;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['runner']);
    IF c.kind = 'runner' THEN
        PERFORM fleetq.refuse_schedule_of_other_lanes(c.subject, p_name);
        PERFORM fleetq.refuse_undue_tick(p_tick);
    END IF;
    SELECT * INTO s FROM fleetq.schedules WHERE name = p_name FOR UPDATE;
    IF NOT FOUND OR s.paused_at IS NOT NULL OR p_tick <= s.last_tick THEN
        RETURN QUERY SELECT NULL::bigint, false;  -- gone, paused, or settled already
        RETURN;
    END IF;
    -- a fixed commit is the schedule's, never the runner's to choose (a branch is
    -- resolved by a runner of its lane, the one thing a schedule leaves to it)
    IF s.commit_sha IS NOT NULL AND p_commit IS DISTINCT FROM s.commit_sha THEN
        RAISE EXCEPTION 'schedule % checks commit %, not %', p_name, s.commit_sha, p_commit
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO fleetq.schedule_ticks (schedule, tick) VALUES (p_name, p_tick)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::bigint, false;
        RETURN;
    END IF;
    SELECT r.job_id INTO v_job FROM fleetq.submit_unchecked(
        s.project, s.operation, p_commit, NULL,
        format('schedule:%s:%s', s.name, to_char(p_tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
        NULL, 'schedule:' || s.name, s.payload) AS r;
    UPDATE fleetq.schedule_ticks SET job_id = v_job WHERE schedule = p_name AND tick = p_tick;
    UPDATE fleetq.schedules SET last_tick = p_tick, updated_at = clock_timestamp()
    WHERE name = p_name;
    RETURN QUERY SELECT v_job, true;
END;
$function$;

-- Ticks up to `p_tick` that the catch-up rule leaves unfired (missed while no runner of
-- the schedule's lane ran).
CREATE OR REPLACE FUNCTION fleetq.skip_schedule(p_name text, p_tick timestamptz)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['runner']);
    IF c.kind = 'runner' THEN
        PERFORM fleetq.refuse_schedule_of_other_lanes(c.subject, p_name);
        PERFORM fleetq.refuse_undue_tick(p_tick);
    END IF;
    UPDATE fleetq.schedules SET last_tick = p_tick, updated_at = clock_timestamp()
    WHERE name = p_name AND last_tick < p_tick;
    IF FOUND THEN
        PERFORM fleetq.log_events('schedule_skipped', NULL, NULL, NULL, 'fleetq',
                                  jsonb_build_object('schedule', p_name, 'through', p_tick));
    END IF;
END;
$function$;

-- Pause (a reason is required) or resume a schedule; an operator's action. A resumed
-- schedule goes on from now: the ticks of its pause are not fired.
CREATE OR REPLACE FUNCTION fleetq.pause_schedule(p_name text, p_paused boolean, p_reason text, p_actor text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    c record;
    v_actor text;
    v_reason text := left(p_reason, 2000);  -- shown to operators: bounded
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['operator']);
    v_actor := CASE WHEN c.kind = 'admin' THEN p_actor ELSE c.subject END;
    IF p_paused AND coalesce(btrim(p_reason), '') = '' THEN
        RAISE EXCEPTION 'pausing a schedule takes a reason' USING ERRCODE = 'FQ003';
    END IF;
    UPDATE fleetq.schedules
    SET paused_at = CASE WHEN p_paused THEN coalesce(paused_at, clock_timestamp()) END,
        paused_by = CASE WHEN p_paused THEN v_actor END,
        paused_reason = CASE WHEN p_paused THEN v_reason END,
        last_tick = CASE WHEN NOT p_paused AND paused_at IS NOT NULL
                         THEN greatest(last_tick, clock_timestamp()) ELSE last_tick END,
        updated_at = clock_timestamp()
    WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no schedule %', p_name USING ERRCODE = 'FQ004';
    END IF;
    PERFORM fleetq.log_events(CASE WHEN p_paused THEN 'schedule_paused' ELSE 'schedule_resumed' END,
                              NULL, NULL, NULL, v_actor,
                              jsonb_build_object('schedule', p_name, 'reason', v_reason));
    RETURN p_paused;
END;
$function$;

-- The schedules in force, each with its project's repository: what a runner of a release
-- before migration 0031 reads when it leads the reaper (it fires those of its lanes).
CREATE OR REPLACE FUNCTION fleetq.runner_schedules()
 RETURNS TABLE(name text, cron text, timezone text, commit_sha text, branch text,
               repository text, catch_up text, last_tick timestamptz)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['runner']);
    RETURN QUERY
    SELECT s.name, s.cron, s.timezone, s.commit_sha, s.branch, p.repository, s.catch_up,
           s.last_tick
    FROM fleetq.schedules s JOIN fleetq.projects p ON p.name = s.project
    WHERE s.paused_at IS NULL
    ORDER BY s.name;
END;
$function$;

-- Whether `p_runner` may settle a schedule now: no other runner's turn is in force on it
-- (the schedule's resolving_by, resolving_tick, resolving_until and last_tick). A turn
-- ends when its tick is settled (last_tick reached it) or when it lapses. Columns, not
-- the row: a SQL function's body is checked when it is made, and the protocol files are
-- applied to databases from before migration 0031 too.
CREATE OR REPLACE FUNCTION fleetq.schedule_turn_free(p_by text, p_tick timestamptz, p_until timestamptz, p_last timestamptz, p_runner text)
 RETURNS boolean
 LANGUAGE sql
 VOLATILE
AS $function$
    SELECT p_by IS NULL OR p_by = p_runner OR p_tick <= p_last OR p_until <= clock_timestamp()
$function$;

-- What a runner settles once a minute: the schedules in force of the lanes it serves,
-- except those another runner has the turn on, each with its project's repository (for a
-- branch to resolve). A runner login reads no table directly, and only as itself.
CREATE OR REPLACE FUNCTION fleetq.lane_schedules(p_runner text)
 RETURNS TABLE(name text, cron text, timezone text, commit_sha text, branch text,
               repository text, catch_up text, last_tick timestamptz)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    v_runner text := fleetq.acting_runner(p_runner);
BEGIN
    RETURN QUERY
    SELECT s.name, s.cron, s.timezone, s.commit_sha, s.branch, p.repository, s.catch_up,
           s.last_tick
    FROM fleetq.schedules s
    JOIN fleetq.projects p ON p.name = s.project
    JOIN fleetq.operations o ON o.project = s.project AND o.name = s.operation
    WHERE s.paused_at IS NULL
      AND fleetq.schedule_turn_free(s.resolving_by, s.resolving_tick, s.resolving_until,
                                    s.last_tick, v_runner)
      AND EXISTS (SELECT 1 FROM fleetq.runner_lanes l
                  WHERE l.runner_id = v_runner AND l.lane = o.lane)
    ORDER BY s.name;
END;
$function$;

-- Take the turn to settle the due tick `p_tick` of a schedule: true when it is this
-- runner's, so that one runner of the lane, not each, resolves a branch at the minute.
-- Refused (false) while the tick is settled, the schedule paused or gone, or another
-- runner's turn is in force. A turn lapses after twice the runner's git timeout
-- (schedules.RESOLVE_TIMEOUT_S, 30 s): a runner that dies mid-resolve holds the tick back
-- until then, and the lane's next look fires it. The turn saves work only: firing does
-- not ask for it.
CREATE OR REPLACE FUNCTION fleetq.take_schedule_turn(p_runner text, p_name text, p_tick timestamptz)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    c record;
    v_runner text;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['runner']);
    v_runner := fleetq.acting_runner(p_runner);
    IF c.kind = 'runner' THEN
        PERFORM fleetq.refuse_schedule_of_other_lanes(v_runner, p_name);
        PERFORM fleetq.refuse_undue_tick(p_tick);
    END IF;
    UPDATE fleetq.schedules s
    SET resolving_by = v_runner, resolving_tick = p_tick,
        resolving_until = clock_timestamp() + interval '60 seconds'
    WHERE s.name = p_name AND s.paused_at IS NULL AND s.last_tick < p_tick
      AND fleetq.schedule_turn_free(s.resolving_by, s.resolving_tick, s.resolving_until,
                                    s.last_tick, v_runner);
    RETURN FOUND;
END;
$function$;
