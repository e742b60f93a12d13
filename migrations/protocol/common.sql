-- Protocol: Shared helpers: settings, the event log, clocks of staleness and of measured ends.
--
-- Applied by `fleetq migrate` whenever this file changes (CREATE OR REPLACE; every
-- changed protocol file in one transaction). Change a function here; tables, dropped
-- functions and new signatures go in a numbered migration.

-- ---------------------------------------------------------------------------------------
-- Helpers
-- plpgsql, not sql: a SQL function that reads a table is never inlined, and PostgreSQL
-- (before 18) parses and plans its body on every statement that calls it; plpgsql plans
-- it once per connection. setting_seconds and runner_is_stale are inlined where called.
CREATE OR REPLACE FUNCTION fleetq.setting_int(p_name text)
 RETURNS integer
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
    RETURN (SELECT (value #>> '{}')::integer FROM fleetq.settings WHERE name = p_name);
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.setting_seconds(p_name text)
 RETURNS interval
 LANGUAGE sql
 STABLE
AS $function$
    SELECT make_interval(secs => fleetq.setting_int(p_name))
$function$;

-- Append events (one per job, or one with no job). No NOTIFY: PostgreSQL makes every
-- transaction that notifies commit one at a time, under one lock held through its WAL
-- flush, so a NOTIFY here (claims, starts, outcomes all log events) serialized the whole
-- queue's commits. The console finds new events by their newest id instead
-- (fleetq/console/live.py); wake-ups for work (fleetq_work) and control stay NOTIFYs.
CREATE OR REPLACE FUNCTION fleetq.log_events(p_kind text, p_jobs bigint[], p_runner text, p_versions bigint[], p_actor text, p_detail jsonb DEFAULT '{}'::jsonb)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF p_jobs IS NULL THEN
        INSERT INTO fleetq.events (kind, runner_id, actor, detail)
        VALUES (p_kind, p_runner, p_actor, p_detail);
    ELSIF cardinality(p_jobs) > 0 THEN
        INSERT INTO fleetq.events (kind, job_id, runner_id, lease_version, actor, detail)
        SELECT p_kind, j, p_runner, v, p_actor, p_detail
        FROM unnest(p_jobs, p_versions) AS t(j, v);
    ELSE
        RETURN;
    END IF;
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.refuse_event_rewrite()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    RAISE EXCEPTION 'fleetq.events is append-only' USING ERRCODE = 'insufficient_privilege';
END;
$function$;

-- The end of an execution that ended p_ago_ms before now (NULL: unknown, now is an
-- upper bound), never before its launch.
CREATE OR REPLACE FUNCTION fleetq.measured_end(p_launched timestamp with time zone, p_ago_ms integer)
 RETURNS timestamp with time zone
 LANGUAGE sql
AS $function$
    SELECT CASE WHEN p_ago_ms IS NULL THEN clock_timestamp()
                ELSE greatest(coalesce(p_launched, '-infinity'),
                              clock_timestamp() - make_interval(secs => p_ago_ms / 1000.0))
           END
$function$;

-- Whether a runner's heartbeat is too old: it is then offline, whatever its state says.
-- VOLATILE, as it reads the clock: a STABLE SQL function calling clock_timestamp() is not
-- inlined, and then its body is parsed and planned on every statement that calls it.
CREATE OR REPLACE FUNCTION fleetq.runner_is_stale(p_last_heartbeat timestamp with time zone)
 RETURNS boolean
 LANGUAGE sql
 VOLATILE
AS $function$
    SELECT p_last_heartbeat < clock_timestamp() - fleetq.setting_seconds('runner_offline_after_seconds')
$function$;

-- Whether a runner is listed: forgotten runners are not, until they are heard from again
-- (a runner that registers or heartbeats after it was forgotten is back, with no step of
-- its own: the hot path is untouched).
CREATE OR REPLACE FUNCTION fleetq.runner_listed(p_forgotten_at timestamp with time zone, p_last_heartbeat timestamp with time zone)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT p_forgotten_at IS NULL OR p_last_heartbeat > p_forgotten_at
$function$;

-- Texts a runner reports (reasons, output tails), cut to `p_chars`: from the start, or
-- keeping the end (`p_keep_end`, a tail). A runner login stored a 2 MiB failure reason
-- that every reader of the job then carried; an outcome is never refused for its length.
CREATE OR REPLACE FUNCTION fleetq.clipped(p_texts text[], p_chars integer, p_keep_end boolean DEFAULT false)
 RETURNS text[]
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN p_texts IS NULL THEN NULL ELSE
        ARRAY(SELECT CASE WHEN p_keep_end THEN right(t, p_chars) ELSE left(t, p_chars) END
              FROM unnest(p_texts) WITH ORDINALITY AS u(t, n) ORDER BY n)
    END
$function$;

-- A traceparent that is neither NULL nor W3C's form: refused at submit with the other
-- bad input (FQ003), not left to the jobs table's check (23514, a "database error").
CREATE OR REPLACE FUNCTION fleetq.bad_traceparent(p_value text)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT coalesce(p_value !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$', false)
$function$;

-- `p_value`, refused as bad_text refuses it (an expression's form of refuse_bad_text).
CREATE OR REPLACE FUNCTION fleetq.checked_text(p_value text, p_field text)
 RETURNS text
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
BEGIN
    PERFORM fleetq.refuse_bad_text(p_value, p_field);
    RETURN p_value;
END;
$function$;

-- What is wrong with a payload, or NULL: it must be a JSON object within `p_limit` bytes
-- (its jsonb text), nest at most 100 levels and hold no number over 1,000 characters or
-- beyond a double's range.
-- What the HTTP API's JSON reader refuses, refused for every caller: through SQL a
-- submitter stored an integer of 5,000 digits and arrays nested 1,100 deep, which
-- Python cannot decode, and every runner claiming the job exited. The scans run only
-- on a payload long enough to hold such a number or such nesting.
CREATE OR REPLACE FUNCTION fleetq.payload_problem(p_payload jsonb, p_limit integer)
 RETURNS text
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
DECLARE
    v_bytes integer;
    v_problem text;
BEGIN
    IF jsonb_typeof(p_payload) IS DISTINCT FROM 'object' THEN
        RETURN 'payload must be a JSON object';
    END IF;
    v_bytes := octet_length(p_payload::text);
    IF v_bytes > p_limit THEN
        RETURN format('payload is %s bytes, over the limit of %s', v_bytes, p_limit);
    END IF;
    IF v_bytes > 200 AND jsonb_path_exists(p_payload, 'strict $.**{101}') THEN
        RETURN 'payload nests more than 100 levels deep';
    END IF;
    -- One scan of its numbers (for a payload long enough to hold such a number): over
    -- 1,000 characters Python refuses them; a fraction past a double's range a reader's
    -- JSON decoder makes infinity (`--json` printed Infinity, which is no JSON; the HTTP
    -- API answered null). An integer is read exactly (jsonb writes 1e400 out digit by
    -- digit).
    IF v_bytes > 300 THEN
        SELECT CASE WHEN length(n::text) > 1000
                    THEN 'payload holds a number over 1,000 characters long'
                    ELSE 'payload holds a number beyond a double''s range (1.8e308)' END
        INTO v_problem
        FROM jsonb_path_query(p_payload, 'strict $.** ? (@.type() == "number")') n
        WHERE length(n::text) > 1000
           OR (strpos(n::text, '.') > 0 AND abs(n::text::numeric) > 1.7976931348623157e308)
        LIMIT 1;
    END IF;
    RETURN v_problem;
END;
$function$;

-- A name or key a job carries (node, idempotency key, task, identity): NULL, or 1 to 256
-- bytes with no control character (C0, DEL, C1). What the HTTP API refuses, refused for
-- every caller: through SQL a submitter stored a 100 MiB node and terminal escapes.
CREATE OR REPLACE FUNCTION fleetq.bad_text(p_value text)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT p_value IS NOT NULL
           AND (p_value = '' OR octet_length(p_value) > 256
                OR p_value ~ '[\x01-\x1f\x7f-\x9f]')
$function$;

CREATE OR REPLACE FUNCTION fleetq.refuse_bad_text(p_value text, p_field text)
 RETURNS void
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
BEGIN
    IF fleetq.bad_text(p_value) THEN
        RAISE EXCEPTION '% is empty, over 256 bytes or holds control characters', p_field
            USING ERRCODE = 'FQ003';
    END IF;
END;
$function$;

-- Whether a claim granted `p_runner` the job under token `p_version`: its 'claimed'
-- event, which only a claim writes (runner_note refuses any other kind). What a runner
-- may still write about a lease that has moved on: its run's output, its stop, a ledger
-- entry under that token.
CREATE OR REPLACE FUNCTION fleetq.was_granted(p_runner text, p_job bigint, p_version bigint)
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
    SELECT EXISTS (SELECT 1 FROM fleetq.events e
                   WHERE e.job_id = p_job AND e.kind = 'claimed'
                     AND e.lease_version = p_version AND e.runner_id = p_runner)
$function$;

-- Lock jobs FOR NO KEY UPDATE (an ending's own mode: a dependent submit's KEY SHARE does
-- not block it), waiting a moment at most; returns the ids locked. An ending must not
-- wait for as long as another transaction likes to hold a row (a cancel kept open): what
-- is still held after the moment is left to the caller, to answer busy or settle again
-- later. The moment is for passing locks: a concurrent claim keeps each row its scan
-- locked and found taken until it commits. `p_owner`/`p_state`, when given, are tested
-- in the locking statements themselves: a runner's call never locks another's lease.
CREATE OR REPLACE FUNCTION fleetq.lock_jobs(p_ids bigint[], p_owner text, p_state text)
 RETURNS bigint[]
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_locked bigint[];
    v_more bigint[];
    v_lock_timeout text;
BEGIN
    SELECT array_agg(l.id) INTO v_locked
    FROM (SELECT j.id FROM fleetq.jobs j
          WHERE j.id = ANY (p_ids) AND (p_owner IS NULL OR j.lease_owner = p_owner)
            AND (p_state IS NULL OR j.state = p_state)
          ORDER BY j.id FOR NO KEY UPDATE SKIP LOCKED) l;
    IF coalesce(cardinality(v_locked), 0) = coalesce(cardinality(p_ids), 0) THEN
        RETURN coalesce(v_locked, '{}');  -- the usual case: nothing held, or none given
    END IF;
    v_lock_timeout := current_setting('lock_timeout');
    BEGIN
        PERFORM set_config('lock_timeout', '250ms', true);
        SELECT array_agg(l.id) INTO v_more
        FROM (SELECT j.id FROM fleetq.jobs j
              WHERE j.id = ANY (p_ids) AND j.id <> ALL (coalesce(v_locked, '{}'))
                AND (p_owner IS NULL OR j.lease_owner = p_owner)
                AND (p_state IS NULL OR j.state = p_state)
              ORDER BY j.id FOR NO KEY UPDATE) l;
    EXCEPTION WHEN lock_not_available THEN
        v_more := NULL;  -- held still
    END;
    PERFORM set_config('lock_timeout', v_lock_timeout, true);
    RETURN coalesce(v_locked, '{}') || coalesce(v_more, '{}');
END;
$function$;

-- Dependencies are read live. A submit or an ending at REPEATABLE READ or SERIALIZABLE
-- reads them as of its snapshot: it misses a dependency that ended, or a dependent
-- submitted, since the snapshot, and the dependent waits for ever (another tenant's
-- job, as like as not). Refused instead, which costs only the caller its call.
CREATE OR REPLACE FUNCTION fleetq.require_read_committed(p_what text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION '% runs at READ COMMITTED only, not %', p_what,
                        upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'FQ003';
    END IF;
END;
$function$;
