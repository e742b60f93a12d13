-- Least privilege: who may call what, and as whom (issue 13).
--
-- Until now any connection could act as any runner: every protocol function took the
-- runner as a parameter, and a second login committed `complete(p_runner => 'node-a/r')`
-- for another runner's job, or rewound a fencing token with a plain UPDATE. Priority was
-- forgeable too: the class follows `submitted_by`, which any caller chose.
--
-- Now:
-- - The schema and everything in it belong to `fleetq_owner` (NOLOGIN). Four groups
--   receive rights: `fleetq_runner`, `fleetq_submitter`, `fleetq_operator` and
--   `fleetq_reader`. PUBLIC keeps nothing: no table, no function.
-- - fleetq.logins maps a login role (session_user) to what it is: a runner and its id,
--   or a submitter, operator or reader and the identity it acts as. `fleetq roles add-*`
--   creates such logins.
-- - Each entry point is a SECURITY DEFINER function with a fixed search_path that first
--   establishes the caller (`fleetq.caller()`), then calls the unchecked implementation
--   (renamed `*_unchecked`, executable by nobody but the owner). A runner login acts
--   only as its own runner id: a runner parameter naming another is refused (42501). A
--   submitter's jobs are submitted by its own identity, so the priority class follows
--   who really asked; an operator's actions are audited under its identity.
-- - A caller that is not a fleetq login but a superuser or a member of fleetq_owner (the
--   embedded single-user server, the demo, an administrator's psql) is trusted as
--   before: the parameters say who acts. That keeps local use unchanged.
-- - Runners read only through functions that answer about their own work.

DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['fleetq_owner', 'fleetq_runner', 'fleetq_submitter',
                             'fleetq_operator', 'fleetq_reader'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another database of this cluster created it meanwhile
            END;
        END IF;
    END LOOP;
END;
$$;

-- Resource limits for a command job's processes (setrlimit), set per operation:
-- {"memory_mb", "cpu_seconds", "open_files", "output_mb"}, each optional.
ALTER TABLE fleetq.operations ADD COLUMN limits jsonb NOT NULL DEFAULT '{}'
    CHECK (jsonb_typeof(limits) = 'object');

CREATE TABLE fleetq.logins (
    role_name   text PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('runner', 'submitter', 'operator', 'reader')),
    subject     text NOT NULL,   -- the runner id, or the identity it acts as
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Who is calling: (kind, subject). Trusted administrators answer ('admin', NULL); a
-- login fleetq does not know is refused.
CREATE FUNCTION fleetq.caller(OUT kind text, OUT subject text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT l.kind, l.subject INTO kind, subject FROM fleetq.logins l
    WHERE l.role_name = session_user;
    IF FOUND THEN
        RETURN;
    END IF;
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = session_user)
       OR pg_has_role(session_user, 'fleetq_owner', 'MEMBER') THEN
        kind := 'admin';
        RETURN;
    END IF;
    RAISE EXCEPTION 'login % is not a fleetq login (fleetq roles add-…)', session_user
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

-- The runner id a call may act as: the caller's own (a runner login naming another is
-- refused), or the parameter for a trusted administrator.
CREATE FUNCTION fleetq.acting_runner(p_runner text) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM fleetq.caller();
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
$$;

-- Refuse unless the caller is one of `p_kinds` (or a trusted administrator).
CREATE FUNCTION fleetq.require(p_kinds text[], OUT kind text, OUT subject text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT c.kind, c.subject INTO kind, subject FROM fleetq.caller() c;
    IF kind <> 'admin' AND NOT kind = ANY (p_kinds) THEN
        RAISE EXCEPTION 'login % (a % login) may not do this', session_user, kind
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------------------
-- The implementations keep their bodies and lose their callers: renamed *_unchecked.

ALTER FUNCTION fleetq.claim(text, text, integer, uuid) RENAME TO claim_unchecked;
ALTER FUNCTION fleetq.heartbeat(text, bigint[], bigint[]) RENAME TO heartbeat_unchecked;
ALTER FUNCTION fleetq.report_start(text, bigint, bigint, text, uuid, integer, timestamptz,
                                   integer) RENAME TO report_start_unchecked;
ALTER FUNCTION fleetq.complete(text, bigint[], bigint[], text[], integer[], text[], text[],
                               integer[], integer[], integer[]) RENAME TO complete_unchecked;
ALTER FUNCTION fleetq.report_lost(text, bigint, bigint, text) RENAME TO report_lost_unchecked;
ALTER FUNCTION fleetq.confirm_stop(text, bigint, bigint, integer, text, integer)
    RENAME TO confirm_stop_unchecked;
ALTER FUNCTION fleetq.release(text, bigint, bigint, text, boolean, integer)
    RENAME TO release_unchecked;
ALTER FUNCTION fleetq.register_runner(text, text, text[], integer, integer, text[], integer[],
                                      text, integer) RENAME TO register_runner_unchecked;
ALTER FUNCTION fleetq.set_runner_state(text, text, text, text) RENAME TO set_runner_state_unchecked;
ALTER FUNCTION fleetq.submit(text, text, text, text, text, text, text, jsonb)
    RENAME TO submit_unchecked;
ALTER FUNCTION fleetq.cancel(bigint, text, text) RENAME TO cancel_unchecked;
ALTER FUNCTION fleetq.reap(integer, timestamptz) RENAME TO reap_unchecked;
ALTER FUNCTION fleetq.fenced_write(text, bigint, bigint, jsonb) RENAME TO fenced_write_unchecked;

-- ---------------------------------------------------------------------------------------
-- Runner entry points: the runner is the caller's own.

CREATE FUNCTION fleetq.claim(p_runner text, p_lane text, p_limit integer, p_claim_id uuid)
RETURNS TABLE (
    job_id bigint, lease_version bigint, lease_expires_at timestamptz, project text,
    operation text, commit_sha text, requested_node text, payload jsonb, task_id text,
    timeout_s integer, memory_mb integer, cpu_millis integer, priority_class smallint,
    reassign_count integer, lost_count smallint
)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM fleetq.claim_unchecked(fleetq.acting_runner(p_runner), p_lane, p_limit,
                                         p_claim_id)
$$;

CREATE FUNCTION fleetq.heartbeat(p_runner text, p_jobs bigint[], p_versions bigint[])
RETURNS TABLE (job_id bigint, status text, lease_expires_at timestamptz)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM fleetq.heartbeat_unchecked(fleetq.acting_runner(p_runner), p_jobs, p_versions)
$$;

CREATE FUNCTION fleetq.report_start(
    p_runner text, p_job bigint, p_version bigint, p_node text, p_run_id uuid, p_pid integer,
    p_process_started_at timestamptz, p_prepare_ms integer
) RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT fleetq.report_start_unchecked(fleetq.acting_runner(p_runner), p_job, p_version,
                                         p_node, p_run_id, p_pid, p_process_started_at,
                                         p_prepare_ms)
$$;

CREATE FUNCTION fleetq.complete(
    p_runner text, p_jobs bigint[], p_versions bigint[], p_outcomes text[],
    p_exit_codes integer[], p_reasons text[], p_log_tails text[], p_prepare_ms integer[],
    p_run_ms integer[], p_ended_ago_ms integer[]
) RETURNS TABLE (job_id bigint, status text)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM fleetq.complete_unchecked(fleetq.acting_runner(p_runner), p_jobs, p_versions,
                                            p_outcomes, p_exit_codes, p_reasons, p_log_tails,
                                            p_prepare_ms, p_run_ms, p_ended_ago_ms)
$$;

CREATE FUNCTION fleetq.report_lost(p_runner text, p_job bigint, p_version bigint, p_reason text)
RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT fleetq.report_lost_unchecked(fleetq.acting_runner(p_runner), p_job, p_version,
                                        p_reason)
$$;

CREATE FUNCTION fleetq.confirm_stop(
    p_runner text, p_job bigint, p_version bigint, p_signal integer, p_reason text,
    p_ended_ago_ms integer DEFAULT NULL
) RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT fleetq.confirm_stop_unchecked(fleetq.acting_runner(p_runner), p_job, p_version,
                                         p_signal, p_reason, p_ended_ago_ms)
$$;

CREATE FUNCTION fleetq.release(
    p_runner text, p_job bigint, p_version bigint, p_reason text, p_fenced boolean DEFAULT false,
    p_ended_ago_ms integer DEFAULT NULL
) RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT fleetq.release_unchecked(fleetq.acting_runner(p_runner), p_job, p_version, p_reason,
                                    p_fenced, p_ended_ago_ms)
$$;

CREATE FUNCTION fleetq.register_runner(
    p_node text, p_name text, p_capabilities text[], p_memory_mb integer,
    p_cpu_millis integer, p_lanes text[], p_slots integer[], p_version text, p_pid integer
) RETURNS SETOF fleetq.runners
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM fleetq.acting_runner(p_node || '/' || p_name);
    RETURN QUERY SELECT * FROM fleetq.register_runner_unchecked(
        p_node, p_name, p_capabilities, p_memory_mb, p_cpu_millis, p_lanes, p_slots, p_version,
        p_pid);
END;
$$;

-- Any runner (or an administrator) may lead the reaper; only an administrator may move
-- its clock (p_now, for tests).
CREATE FUNCTION fleetq.reap(p_limit integer DEFAULT 1000, p_now timestamptz DEFAULT NULL)
RETURNS TABLE (requeued integer, failed integer, leader boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['runner']);
    IF p_now IS NOT NULL AND c.kind <> 'admin' THEN
        RAISE EXCEPTION 'only an administrator may reap at another time'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN QUERY SELECT * FROM fleetq.reap_unchecked(p_limit, p_now);
END;
$$;

-- The fenced ledger, written by a handler: a runner login writes only under a token it
-- was granted for that job (its own claim), so it cannot forge a newer one.
CREATE FUNCTION fleetq.fenced_write(p_key text, p_job bigint, p_token bigint, p_value jsonb)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['runner']);
    IF c.kind = 'runner' AND NOT EXISTS (
        SELECT 1 FROM fleetq.events e
        WHERE e.job_id = p_job AND e.kind = 'claimed' AND e.lease_version = p_token
          AND e.runner_id = c.subject) THEN
        RAISE EXCEPTION 'runner % never held job % under token %', c.subject, p_job, p_token
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN fleetq.fenced_write_unchecked(p_key, p_job, p_token, p_value);
END;
$$;

-- A runner changes its own state (drains itself, goes offline at shutdown); an operator
-- any runner's, recorded under the operator's identity.
CREATE FUNCTION fleetq.set_runner_state(p_runner text, p_state text, p_reason text, p_actor text)
RETURNS SETOF fleetq.runners
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record;
    v_actor text := p_actor;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['runner', 'operator']);
    IF c.kind = 'runner' THEN
        PERFORM fleetq.acting_runner(p_runner);
        v_actor := c.subject;
    ELSIF c.kind = 'operator' THEN
        v_actor := c.subject;
    END IF;
    RETURN QUERY SELECT * FROM fleetq.set_runner_state_unchecked(p_runner, p_state, p_reason,
                                                                 v_actor);
END;
$$;

-- ---------------------------------------------------------------------------------------
-- Submitting and cancelling: the identity is the caller's, never chosen.

CREATE FUNCTION fleetq.submit(
    p_project text, p_operation text, p_commit text, p_requested_node text,
    p_idempotency_key text, p_task_id text, p_submitted_by text, p_payload jsonb
) RETURNS TABLE (job_id bigint, created boolean, state text, priority_class smallint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['submitter', 'operator']);
    RETURN QUERY SELECT * FROM fleetq.submit_unchecked(
        p_project, p_operation, p_commit, p_requested_node, p_idempotency_key, p_task_id,
        CASE WHEN c.kind = 'admin' THEN p_submitted_by ELSE c.subject END, p_payload);
END;
$$;

-- An operator cancels any job; a submitter only the jobs it submitted.
CREATE FUNCTION fleetq.cancel(p_job bigint, p_actor text, p_reason text)
RETURNS TABLE (job_id bigint, previous_state text, state text, stop_pending boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['submitter', 'operator']);
    IF c.kind = 'submitter' AND NOT EXISTS (
        SELECT 1 FROM fleetq.jobs j WHERE j.id = p_job AND j.submitted_by = c.subject) THEN
        RAISE EXCEPTION 'submitter % may cancel only its own jobs', c.subject
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN QUERY SELECT * FROM fleetq.cancel_unchecked(
        p_job, CASE WHEN c.kind = 'admin' THEN p_actor ELSE c.subject END, p_reason);
END;
$$;

-- ---------------------------------------------------------------------------------------
-- What a runner reads, about its own work only.

-- State, owner and token of jobs this runner executes (to stop those it lost).
CREATE FUNCTION fleetq.runner_job_states(p_runner text, p_jobs bigint[])
RETURNS TABLE (job_id bigint, state text, lease_owner text, lease_version bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
$$;

-- A job this runner holds, in full (to adopt a run launched before a restart).
CREATE FUNCTION fleetq.runner_job(p_runner text, p_job bigint) RETURNS SETOF fleetq.jobs
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM fleetq.jobs
    WHERE id = p_job AND reserved_on = fleetq.acting_runner(p_runner)
$$;

-- Leases and unconfirmed cancelled jobs this runner holds.
CREATE FUNCTION fleetq.runner_held(p_runner text)
RETURNS TABLE (job_id bigint, lease_version bigint, state text, held_s float8)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT j.id, j.lease_version, j.state,
           extract(epoch FROM clock_timestamp() - j.claimed_at)::float8
    FROM fleetq.jobs j
    WHERE j.reserved_on = fleetq.acting_runner(p_runner)
    ORDER BY j.id
$$;

-- This runner's executions with no recorded end, and whether their lease is still its.
CREATE FUNCTION fleetq.runner_open_executions(p_runner text)
RETURNS TABLE (job_id bigint, lease_version bigint, run_id uuid, held boolean)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT e.job_id, e.lease_version, e.run_id,
           (j.lease_owner IS NOT DISTINCT FROM e.runner_id AND j.lease_version = e.lease_version
            AND j.state IN ('claimed', 'running'))
    FROM fleetq.executions e
    JOIN fleetq.jobs j ON j.id = e.job_id
    WHERE e.runner_id = fleetq.acting_runner(p_runner) AND e.ended_at IS NULL
    ORDER BY e.job_id, e.lease_version
$$;

-- This runner's state (paused, draining, drained), which it follows.
CREATE FUNCTION fleetq.runner_state(p_runner text)
RETURNS TABLE (state text, state_reason text)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT r.state, r.state_reason FROM fleetq.runners r
    WHERE r.id = fleetq.acting_runner(p_runner)
$$;

-- What each operation runs, with its project's repository.
CREATE FUNCTION fleetq.runner_operations()
RETURNS TABLE (project text, operation text, command text, handler text, timeout_s integer,
               repository text, limits jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM fleetq.require(ARRAY['runner', 'operator', 'reader']);
    RETURN QUERY
    SELECT o.project, o.name, o.command, o.handler, o.timeout_s, p.repository, o.limits
    FROM fleetq.operations o
    JOIN fleetq.projects p ON p.name = o.project;
END;
$$;

-- The lease length and the offline threshold runners heartbeat against.
CREATE FUNCTION fleetq.runner_timing()
RETURNS TABLE (lease_seconds integer, offline_after_seconds integer)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT fleetq.setting_int('lease_seconds'), fleetq.setting_int('runner_offline_after_seconds')
$$;

-- Inside a handler's own transaction: lock its job's row under (owner, token), so what
-- the transaction writes commits only while the lease is held (a row lock taken here
-- lasts until that transaction ends). NULL when the lease is not held.
CREATE FUNCTION fleetq.lock_for_handler(p_job bigint, p_runner text, p_version bigint)
RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT 1 FROM fleetq.jobs
    WHERE id = p_job AND lease_owner = fleetq.acting_runner(p_runner)
      AND lease_version = p_version AND state IN ('claimed', 'running')
    FOR UPDATE
$$;

-- A runner's own observation about a job it holds (adoption_refused, with evidence).
CREATE FUNCTION fleetq.runner_note(p_kind text, p_job bigint, p_runner text, p_version bigint,
                                   p_detail jsonb)
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT fleetq.log_events(p_kind, ARRAY[p_job], fleetq.acting_runner(p_runner),
                             ARRAY[p_version], NULL, p_detail)
$$;

-- ---------------------------------------------------------------------------------------
-- Who may use what, as data: a later migration that adds an entry point (or a table a
-- group reads) adds its rows here, and fleetq.secure(), which `fleetq migrate` runs
-- after every migration, grants them. Ownership and PUBLIC's rights are asserted there
-- too (an object a migration creates is owned by whoever migrated, and a new function
-- is executable by PUBLIC until revoked).

CREATE TABLE fleetq.grants (
    privilege  text NOT NULL CHECK (privilege IN ('EXECUTE', 'SELECT')),
    object     text NOT NULL,  -- 'FUNCTION fleetq.claim(text, …)', 'TABLE fleetq.jobs'
    grantee    text NOT NULL CHECK (grantee IN ('fleetq_runner', 'fleetq_submitter',
                                                'fleetq_operator', 'fleetq_reader')),
    PRIMARY KEY (privilege, object, grantee)
);

INSERT INTO fleetq.grants (privilege, object, grantee)
SELECT 'EXECUTE', 'FUNCTION fleetq.' || f, 'fleetq_runner'
FROM unnest(ARRAY[
    'claim(text, text, integer, uuid)', 'heartbeat(text, bigint[], bigint[])',
    'report_start(text, bigint, bigint, text, uuid, integer, timestamptz, integer)',
    'complete(text, bigint[], bigint[], text[], integer[], text[], text[], integer[], '
        'integer[], integer[])',
    'report_lost(text, bigint, bigint, text)',
    'confirm_stop(text, bigint, bigint, integer, text, integer)',
    'release(text, bigint, bigint, text, boolean, integer)',
    'register_runner(text, text, text[], integer, integer, text[], integer[], text, integer)',
    'reap(integer, timestamptz)', 'fenced_write(text, bigint, bigint, jsonb)',
    'set_runner_state(text, text, text, text)',
    'runner_job_states(text, bigint[])', 'runner_held(text)', 'runner_job(text, bigint)',
    'runner_open_executions(text)', 'runner_state(text)', 'runner_operations()',
    'runner_timing()', 'lock_for_handler(bigint, text, bigint)',
    'runner_note(text, bigint, text, bigint, jsonb)']) f
UNION ALL
SELECT 'EXECUTE', 'FUNCTION fleetq.' || f, g
FROM unnest(ARRAY['submit(text, text, text, text, text, text, text, jsonb)',
                  'cancel(bigint, text, text)']) f,
     unnest(ARRAY['fleetq_submitter', 'fleetq_operator']) g
UNION ALL
SELECT 'EXECUTE', 'FUNCTION fleetq.set_runner_state(text, text, text, text)', 'fleetq_operator'
UNION ALL
-- what the console, the CLI's listings and the views call inside their queries
SELECT 'EXECUTE', 'FUNCTION fleetq.' || f, g
FROM unnest(ARRAY[
    'runner_operations()', 'runner_timing()', 'setting_int(text)', 'setting_seconds(text)',
    'runner_is_stale(timestamptz)',
    'ineligibility(text[], text, integer, integer, text, text[], text, boolean, integer, '
        'integer, integer, integer)',
    'eligible(text[], text, integer, integer, text, text[], text, boolean, integer, '
        'integer, integer, integer)']) f,
     unnest(ARRAY['fleetq_reader', 'fleetq_operator', 'fleetq_submitter']) g
UNION ALL
-- every client checks the schema version first
SELECT 'SELECT', 'TABLE fleetq.schema_migrations', g
FROM unnest(ARRAY['fleetq_runner', 'fleetq_submitter', 'fleetq_operator', 'fleetq_reader']) g
UNION ALL
-- a submitter reads jobs and results (`fleetq jobs`, `fleetq result`); readers and
-- operators read every table but the logins (below)
SELECT 'SELECT', 'TABLE fleetq.' || t, 'fleetq_submitter'
FROM unnest(ARRAY['jobs', 'results', 'events', 'identities', 'projects', 'operations']) t;

CREATE FUNCTION fleetq.secure() RETURNS void
LANGUAGE plpgsql AS $$
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
                                    fleetq_reader;
    -- readers (console --readonly, stats, overlaps) read everything; operators too
    GRANT SELECT ON ALL TABLES IN SCHEMA fleetq TO fleetq_reader, fleetq_operator;
    REVOKE SELECT ON fleetq.logins FROM fleetq_reader;
    FOR o IN SELECT * FROM fleetq.grants LOOP
        EXECUTE format('GRANT %s ON %s TO %I', o.privilege, o.object, o.grantee);
    END LOOP;
END;
$$;

SELECT fleetq.secure();
