-- Protocol: Who is calling (logins mapped to runners and identities), what each role may do, and
-- the runner-facing reads a runner login may make about its own jobs only.
--
-- Applied by `fleetq migrate` whenever this file changes (CREATE OR REPLACE; every
-- changed protocol file in one transaction). Change a function here; tables, dropped
-- functions and new signatures go in a numbered migration.

-- Who is calling: (kind, subject). Trusted administrators answer ('admin', NULL); a
-- login fleetq does not know is refused. An API token in the transaction-local setting
-- `fleetq.token` (migration 0019) makes the caller the token's holder: only a gateway
-- login or an administrator may present one, and a gateway presents one always.
CREATE OR REPLACE FUNCTION fleetq.caller(OUT kind text, OUT subject text)
 RETURNS record
 LANGUAGE plpgsql
 STABLE
AS $function$
DECLARE
    v_token text := current_setting('fleetq.token', true);
BEGIN
    SELECT l.kind, l.subject INTO kind, subject FROM fleetq.logins l
    WHERE l.role_name = session_user;
    IF NOT FOUND THEN
        -- a superuser is a member of every role (and a query of pg_roles first cost each
        -- of a superuser's calls a statement more)
        IF pg_has_role(session_user, 'fleetq_owner', 'MEMBER') THEN
            kind := 'admin';
        ELSE
            RAISE EXCEPTION 'login % is not a fleetq login (fleetq roles add-…)', session_user
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END IF;
    IF coalesce(v_token, '') = '' THEN
        IF kind = 'gateway' THEN
            RAISE EXCEPTION 'login % is a gateway: it acts only for an API token''s holder',
                            session_user
                USING ERRCODE = 'FQ007';
        END IF;
        RETURN;
    END IF;
    IF kind NOT IN ('admin', 'gateway') THEN
        RAISE EXCEPTION 'login % (a % login) cannot act for an API token', session_user, kind
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT t.kind, t.subject INTO kind, subject FROM fleetq.api_tokens t
    WHERE t.token_sha256 = sha256(convert_to(v_token, 'UTF8'));
    IF NOT FOUND THEN
        RAISE EXCEPTION 'invalid or revoked API token' USING ERRCODE = 'FQ007';
    END IF;
END;
$function$;

-- Act for the holder of `p_token` for the rest of the transaction, and say who that is:
-- what the HTTP API runs first in each request's transaction (one round trip). The
-- setting outlives this function (its SET clause restores search_path only); caller()
-- refuses an unknown or revoked token, and any login but a gateway or an administrator.
CREATE OR REPLACE FUNCTION fleetq.act_for_token(p_token text)
 RETURNS TABLE(kind text, subject text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    PERFORM set_config('fleetq.token', coalesce(p_token, ''), true);
    RETURN QUERY SELECT c.kind, c.subject FROM fleetq.caller() c;
END;
$function$;

-- The runner id a call may act as: the caller's own (a runner login naming another is
-- refused), or the parameter for a trusted administrator.
CREATE OR REPLACE FUNCTION fleetq.acting_runner(p_runner text)
 RETURNS text
 LANGUAGE plpgsql
 STABLE
AS $function$
DECLARE
    c record;
BEGIN
    c := fleetq.caller();  -- an expression, not a query: no executor started per call
    IF c.kind = 'admin' THEN
        RETURN p_runner;
    END IF;
    IF c.kind <> 'runner' THEN
        RAISE EXCEPTION 'login % is a % login, not a runner', session_user, c.kind
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_runner IS DISTINCT FROM c.subject THEN
        RAISE EXCEPTION 'login % acts as runner % only, not as %', session_user, c.subject,
                        p_runner
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN c.subject;
END;
$function$;

-- Refuse unless the caller is one of `p_kinds` (or a trusted administrator).
CREATE OR REPLACE FUNCTION fleetq.require(p_kinds text[], OUT kind text, OUT subject text)
 RETURNS record
 LANGUAGE plpgsql
 STABLE
AS $function$
DECLARE
    c record;
BEGIN
    c := fleetq.caller();  -- an expression, not a query: no executor started per call
    kind := c.kind;
    subject := c.subject;
    IF kind <> 'admin' AND NOT kind = ANY (p_kinds) THEN
        IF coalesce(current_setting('fleetq.token', true), '') <> '' THEN
            RAISE EXCEPTION 'the API token of % (a % token) may not do this', subject, kind
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        RAISE EXCEPTION 'login % (a % login) may not do this', session_user, kind
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.secure()
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    o record;
BEGIN
    EXECUTE 'ALTER SCHEMA fleetq OWNER TO fleetq_owner';
    FOR o IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'fleetq' AND c.relkind IN ('r', 'v', 'm', 'p')
               AND c.relowner <> 'fleetq_owner'::regrole LOOP
        EXECUTE format('ALTER TABLE fleetq.%I OWNER TO fleetq_owner', o.relname);
    END LOOP;
    FOR o IN SELECT p.oid::regprocedure AS sig FROM pg_proc p
             JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'fleetq' AND p.proowner <> 'fleetq_owner'::regrole
    LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO fleetq_owner', o.sig);
    END LOOP;
    REVOKE ALL ON SCHEMA fleetq FROM PUBLIC;
    REVOKE ALL ON ALL TABLES IN SCHEMA fleetq FROM PUBLIC;
    REVOKE ALL ON ALL SEQUENCES IN SCHEMA fleetq FROM PUBLIC;
    REVOKE ALL ON ALL FUNCTIONS IN SCHEMA fleetq FROM PUBLIC;
    GRANT USAGE ON SCHEMA fleetq TO fleetq_runner, fleetq_submitter, fleetq_operator,
                                    fleetq_reader, fleetq_gateway;
    -- readers (console --readonly, stats, overlaps) read everything; operators too
    GRANT SELECT ON ALL TABLES IN SCHEMA fleetq TO fleetq_reader, fleetq_operator;
    -- who acts as what is the administrators' (docs/security.md)
    REVOKE SELECT ON fleetq.logins FROM fleetq_reader, fleetq_operator;
    -- a token's hash is a credential's fingerprint: only the owner reads them
    REVOKE SELECT ON fleetq.api_tokens FROM fleetq_reader, fleetq_operator;
    FOR o IN SELECT * FROM fleetq.grants LOOP
        EXECUTE format('GRANT %s ON %s TO %I', o.privilege, o.object, o.grantee);
    END LOOP;
    -- A session holding the reaper's pass open is ended (fleetq.end_stuck_pass): the
    -- owner sees sessions' transactions and may signal them. Granted where the migrating
    -- login may (a superuser); else said, and such a holder keeps what it took.
    IF NOT (pg_has_role('fleetq_owner', 'pg_read_all_stats', 'MEMBER')
            AND pg_has_role('fleetq_owner', 'pg_signal_backend', 'MEMBER')) THEN
        BEGIN
            GRANT pg_read_all_stats, pg_signal_backend TO fleetq_owner;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE WARNING 'fleetq: a superuser should grant pg_read_all_stats and '
                          'pg_signal_backend to fleetq_owner, so that a session holding '
                          'the reaper''s pass open can be ended (docs/security.md)';
        END;
    END IF;
END;
$function$;

-- This runner's state (paused, draining, drained), which it follows.
CREATE OR REPLACE FUNCTION fleetq.runner_state(p_runner text)
 RETURNS TABLE(state text, state_reason text)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT r.state, r.state_reason FROM fleetq.runners r
    WHERE r.id = fleetq.acting_runner(p_runner)
$function$;

-- A job this runner holds, in full (to adopt a run launched before a restart).
CREATE OR REPLACE FUNCTION fleetq.runner_job(p_runner text, p_job bigint)
 RETURNS SETOF fleetq.jobs
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT * FROM fleetq.jobs
    WHERE id = p_job AND reserved_on = fleetq.acting_runner(p_runner)
$function$;

-- State, owner and token of jobs this runner executes (to stop those it lost).
CREATE OR REPLACE FUNCTION fleetq.runner_job_states(p_runner text, p_jobs bigint[])
 RETURNS TABLE(job_id bigint, state text, lease_owner text, lease_version bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_runner text := fleetq.acting_runner(p_runner);
BEGIN
    RETURN QUERY
    SELECT j.id, j.state, j.lease_owner, j.lease_version
    FROM fleetq.jobs j
    WHERE j.id = ANY (p_jobs)
      AND EXISTS (SELECT 1 FROM fleetq.events e WHERE e.job_id = j.id AND e.kind = 'claimed'
                                                  AND e.runner_id = v_runner);
END;
$function$;

-- Leases and unconfirmed cancelled jobs this runner holds.
CREATE OR REPLACE FUNCTION fleetq.runner_held(p_runner text)
 RETURNS TABLE(job_id bigint, lease_version bigint, state text, held_s double precision)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT j.id, j.lease_version, j.state,
           extract(epoch FROM clock_timestamp() - j.claimed_at)::float8
    FROM fleetq.jobs j
    WHERE j.reserved_on = fleetq.acting_runner(p_runner)
    ORDER BY j.id
$function$;

-- This runner's executions with no recorded end, and whether their lease is still its.
CREATE OR REPLACE FUNCTION fleetq.runner_open_executions(p_runner text)
 RETURNS TABLE(job_id bigint, lease_version bigint, run_id uuid, held boolean)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT e.job_id, e.lease_version, e.run_id,
           (j.lease_owner IS NOT DISTINCT FROM e.runner_id AND j.lease_version = e.lease_version
            AND j.state IN ('claimed', 'running'))
    FROM fleetq.executions e
    JOIN fleetq.jobs j ON j.id = e.job_id
    WHERE e.runner_id = fleetq.acting_runner(p_runner) AND e.ended_at IS NULL
    ORDER BY e.job_id, e.lease_version
$function$;

-- What each operation runs, with its project's repository.
-- Dropped first: its columns grew (evidence, 0041), and a protocol file must also apply
-- to a schema from before that migration (test_migrate.py), where the old one stands
-- (its grant is given again by fleetq.secure(), after every protocol file).
DROP FUNCTION IF EXISTS fleetq.runner_operations();
CREATE OR REPLACE FUNCTION fleetq.runner_operations()
 RETURNS TABLE(project text, operation text, command text, handler text, timeout_s integer, repository text, limits jsonb, evidence jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    PERFORM fleetq.require(ARRAY['runner', 'operator', 'reader']);
    RETURN QUERY
    SELECT o.project, o.name, o.command, o.handler, o.timeout_s, p.repository, o.limits,
           o.evidence
    FROM fleetq.operations o
    JOIN fleetq.projects p ON p.name = o.project;
END;
$function$;

-- The lease length and the offline threshold runners heartbeat against.
CREATE OR REPLACE FUNCTION fleetq.runner_timing()
 RETURNS TABLE(lease_seconds integer, offline_after_seconds integer)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT fleetq.setting_int('lease_seconds'), fleetq.setting_int('runner_offline_after_seconds')
$function$;

-- A runner's own observation about a job it holds (adoption_refused, with evidence):
-- only kinds that are a runner's to say, about a lease it holds, read without a lock.
-- Any kind once wrote a 'claimed' event under any token, which fenced_write and
-- append_output then believed.
CREATE OR REPLACE FUNCTION fleetq.runner_note(p_kind text, p_job bigint, p_runner text, p_version bigint, p_detail jsonb)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    v_runner text := fleetq.acting_runner(p_runner);
BEGIN
    IF p_kind IS DISTINCT FROM 'adoption_refused' THEN
        RAISE EXCEPTION 'a runner notes adoption_refused only, not %', p_kind
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM fleetq.jobs j WHERE j.id = p_job AND j.reserved_on = v_runner
                                              AND j.lease_version = p_version) THEN
        RAISE EXCEPTION 'runner % does not hold job % under token %', v_runner, p_job, p_version
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF octet_length(p_detail::text) > 8192 THEN
        RAISE EXCEPTION 'a note''s detail is at most 8192 bytes' USING ERRCODE = 'FQ003';
    END IF;
    PERFORM fleetq.log_events(p_kind, ARRAY[p_job], v_runner, ARRAY[p_version], NULL, p_detail);
END;
$function$;

-- One process per runner id, held by a session (the runner's LISTEN connection) as a
-- session advisory lock was, but in a row only fleetq's functions write: any login could
-- take an advisory key first. Taken when the row names no session alive (its pid under
-- its login; pg_stat_activity shows both for every session) or this very session. Not
-- taken: the holder, to name it. An older runner of this id may still hold the old
-- advisory lock (a rolling upgrade): its session is one of this runner's logins (or an
-- administrator's), which no other login can be, so it counts as a holder too.
CREATE OR REPLACE FUNCTION fleetq.take_runner_id(p_runner text)
 RETURNS TABLE(taken boolean, pid integer, login text, application_name text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_runner text := fleetq.acting_runner(p_runner);
    v_name text := 'runner:' || v_runner;
    h record;  -- not %ROWTYPE: the table comes with migration 0030, after this file
    v_old integer;
BEGIN
    INSERT INTO fleetq.coordination (name) VALUES (v_name) ON CONFLICT DO NOTHING;
    SELECT * INTO h FROM fleetq.coordination c WHERE c.name = v_name FOR UPDATE;
    IF h.holder_pid IS NOT NULL AND h.holder_pid <> pg_backend_pid() AND EXISTS (
           SELECT 1 FROM pg_stat_activity a
           WHERE a.pid = h.holder_pid AND a.usename = h.holder_role) THEN
        RETURN QUERY SELECT false, h.holder_pid, h.holder_role,
                            (SELECT a.application_name FROM pg_stat_activity a
                             WHERE a.pid = h.holder_pid);
        RETURN;
    END IF;
    IF h.holder_pid IS NULL AND h.holder_until > clock_timestamp() THEN
        -- held through the API (hold_runner_id) until then: no pid to name
        RETURN QUERY SELECT false, NULL::integer, h.holder_role, h.holder_app;
        RETURN;
    END IF;
    SELECT l.pid INTO v_old
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
      AND l.classid = 6712433::oid AND l.objid = hashtext(v_runner)::oid  -- 0x666C71, "flq"
      AND l.pid <> pg_backend_pid()
      AND (EXISTS (SELECT 1 FROM fleetq.logins g
                   WHERE g.role_name = a.usename AND g.kind = 'runner' AND g.subject = v_runner)
           OR pg_has_role(a.usename, 'fleetq_owner', 'MEMBER'))
    LIMIT 1;
    IF FOUND THEN
        RETURN QUERY SELECT false, a.pid, a.usename::text, a.application_name
                     FROM pg_stat_activity a WHERE a.pid = v_old;
        RETURN;
    END IF;
    UPDATE fleetq.coordination c
    SET holder_pid = pg_backend_pid(), holder_role = session_user,
        holder_app = current_setting('application_name'), taken_at = clock_timestamp(),
        holder_until = NULL
    WHERE c.name = v_name;
    RETURN QUERY SELECT true, pg_backend_pid(), session_user::text,
                        current_setting('application_name');
END;
$function$;

-- One process per runner id for a runner served through the API (issue 46), which has no
-- session of its own to hold it: a hold for `p_seconds`, renewed by calling again. Taken
-- when no live session holds the row (take_runner_id) and no other holder's hold runs;
-- `p_holder` names the process (its node and runner directory: a restart there takes its
-- own hold back at once, a second process elsewhere is refused until the hold runs out).
-- Not taken: the holder, and how long its hold has left.
CREATE OR REPLACE FUNCTION fleetq.hold_runner_id(p_runner text, p_holder text,
                                                 p_seconds integer)
 RETURNS TABLE(taken boolean, holder text, login text, left_s double precision)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    v_runner text := fleetq.acting_runner(p_runner);
    v_name text := 'runner:' || v_runner;
    h record;
BEGIN
    IF p_seconds IS NULL OR p_seconds NOT BETWEEN 5 AND 300 THEN
        RAISE EXCEPTION 'a runner id is held for 5 to 300 seconds, not %', p_seconds
            USING ERRCODE = 'FQ003';
    END IF;
    IF coalesce(p_holder, '') = '' OR length(p_holder) > 200 THEN
        RAISE EXCEPTION 'a hold names its holder in 1 to 200 characters' USING ERRCODE = 'FQ003';
    END IF;
    INSERT INTO fleetq.coordination (name) VALUES (v_name) ON CONFLICT DO NOTHING;
    SELECT * INTO h FROM fleetq.coordination c WHERE c.name = v_name FOR UPDATE;
    IF h.holder_pid IS NOT NULL AND EXISTS (
           SELECT 1 FROM pg_stat_activity a
           WHERE a.pid = h.holder_pid AND a.usename = h.holder_role) THEN
        RETURN QUERY SELECT false, h.holder_app, h.holder_role, NULL::double precision;
        RETURN;
    END IF;
    IF h.holder_pid IS NULL AND h.holder_until > clock_timestamp()
       AND h.holder_app IS DISTINCT FROM p_holder THEN
        RETURN QUERY SELECT false, h.holder_app, h.holder_role,
                            extract(epoch FROM h.holder_until - clock_timestamp())::float8;
        RETURN;
    END IF;
    UPDATE fleetq.coordination c
    SET holder_pid = NULL, holder_role = session_user, holder_app = p_holder,
        holder_until = clock_timestamp() + p_seconds * interval '1 second',
        taken_at = CASE WHEN c.holder_app IS NOT DISTINCT FROM p_holder AND c.holder_pid IS NULL
                        THEN c.taken_at ELSE clock_timestamp() END
    WHERE c.name = v_name;
    RETURN QUERY SELECT true, p_holder, session_user::text, p_seconds::float8;
END;
$function$;

-- Inside a handler's own transaction: lock its job's row under (owner, token), so what
-- the transaction writes commits only while the lease is held (a row lock taken here
-- lasts until that transaction ends). NULL when the lease is not held.
CREATE OR REPLACE FUNCTION fleetq.lock_for_handler(p_job bigint, p_runner text, p_version bigint)
 RETURNS integer
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT 1 FROM fleetq.jobs
    WHERE id = p_job AND lease_owner = fleetq.acting_runner(p_runner)
      AND lease_version = p_version AND state IN ('claimed', 'running')
    FOR UPDATE
$function$;
