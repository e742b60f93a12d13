-- Protocol: Everything a lease holder writes, each guarded by owner and token (the fencing token):
-- heartbeat, start report, outcome, hand-back, loss report, stop confirmation, the
-- fenced ledger and job output; and the refusals a zombie's writes get.
--
-- Applied by `fleetq migrate` whenever this file changes (CREATE OR REPLACE; every
-- changed protocol file in one transaction). Change a function here; tables, dropped
-- functions and new signatures go in a numbered migration.

CREATE OR REPLACE FUNCTION fleetq.note_stale(p_runner text, p_kind text, p_jobs bigint[], p_versions bigint[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_zombie bigint[];
    v_zombie_versions bigint[];
    v_self bigint[];
    v_self_versions bigint[];
BEGIN
    IF coalesce(cardinality(p_jobs), 0) = 0 THEN
        RETURN;
    END IF;
    WITH w AS (
        SELECT i.id, i.version,
               coalesce(j.released_by = p_runner AND j.released_version = i.version
                        AND j.lease_version = i.version, false) AS own
        FROM unnest(p_jobs, p_versions) AS i(id, version)
        LEFT JOIN fleetq.jobs j ON j.id = i.id
    )
    SELECT array_agg(w.id) FILTER (WHERE NOT w.own),
           array_agg(w.version) FILTER (WHERE NOT w.own),
           array_agg(w.id) FILTER (WHERE w.own),
           array_agg(w.version) FILTER (WHERE w.own)
    INTO v_zombie, v_zombie_versions, v_self, v_self_versions
    FROM w;
    UPDATE fleetq.runners
    SET stale_rejections = stale_rejections + coalesce(cardinality(v_zombie), 0),
        self_races = self_races + coalesce(cardinality(v_self), 0)
    WHERE id = p_runner;
    IF v_zombie IS NOT NULL THEN
        PERFORM fleetq.log_events('stale_rejected', v_zombie, p_runner, v_zombie_versions, NULL,
                                  jsonb_build_object('write', p_kind));
    END IF;
    IF v_self IS NOT NULL THEN
        PERFORM fleetq.log_events('stale_self_race', v_self, p_runner, v_self_versions, NULL,
                                  jsonb_build_object('write', p_kind));
    END IF;
END;
$function$;

-- The fence of a runner handing a lease back (a loss report, a release): NULL when the
-- caller holds (job, version) live, with the row now locked in its transaction; else
-- 'already' (this same hand-back committed before and no newer claim happened since)
-- or 'stale' (counted against the runner).
CREATE OR REPLACE FUNCTION fleetq.hand_back_guard(p_runner text, p_job bigint, p_version bigint, p_kind text)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    j fleetq.jobs%ROWTYPE;
BEGIN
    -- locked only when it is this runner's lease (another's row is never held), and not
    -- against a dependent submit's KEY SHARE (settle_dependents)
    SELECT * INTO j FROM fleetq.jobs
    WHERE id = p_job AND lease_owner = p_runner AND lease_version = p_version
      AND state IN ('claimed', 'running')
    FOR NO KEY UPDATE;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    SELECT * INTO j FROM fleetq.jobs WHERE id = p_job;
    IF FOUND AND j.released_by = p_runner AND j.released_version = p_version
       AND j.lease_version = p_version AND j.released_kind = p_kind THEN
        RETURN 'already';
    END IF;
    PERFORM fleetq.note_stale(p_runner, p_kind, ARRAY[p_job], ARRAY[p_version]);
    RETURN 'stale';
END;
$function$;

-- Give back capacity reserved by jobs whose lease ended (one row per job). Callers clear
-- jobs.reserved_on in their own UPDATE and pass the values it had.
CREATE OR REPLACE FUNCTION fleetq.give_back(p_runners text[], p_lanes text[], p_memory integer[], p_cpu integer[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF coalesce(cardinality(p_runners), 0) = 0 THEN
        RETURN;
    END IF;
    PERFORM 1 FROM fleetq.runners WHERE id = ANY (p_runners) ORDER BY id FOR UPDATE;
    UPDATE fleetq.runners r
    SET reserved_memory_mb = r.reserved_memory_mb - g.memory,
        reserved_cpu_millis = r.reserved_cpu_millis - g.cpu
    FROM (SELECT runner, sum(memory)::integer AS memory, sum(cpu)::integer AS cpu
          FROM unnest(p_runners, p_memory, p_cpu) AS t(runner, memory, cpu)
          GROUP BY runner) g
    WHERE r.id = g.runner
      -- jobs that reserved nothing give nothing back: no write (and no CHECK of the
      -- runner's row, which PostgreSQL re-reads from the catalog per statement that writes)
      AND (g.memory <> 0 OR g.cpu <> 0);
    UPDATE fleetq.runner_lanes l
    SET slots_used = l.slots_used - g.n
    FROM (SELECT runner, lane, count(*)::integer AS n
          FROM unnest(p_runners, p_lanes) AS t(runner, lane)
          GROUP BY runner, lane) g
    WHERE l.runner_id = g.runner AND l.lane = g.lane;
    -- Room freed under a fleet-wide cap lets other runners claim: wake them (an idle
    -- runner's polls back off, so it would otherwise wait up to its --poll-max).
    PERFORM pg_notify('fleetq_work', ln.name)
    FROM fleetq.lanes ln
    WHERE ln.name = ANY (p_lanes)
      AND (ln.max_running IS NOT NULL
           OR EXISTS (SELECT 1 FROM fleetq.projects p WHERE p.max_running IS NOT NULL));
END;
$function$;

-- An in-process handler's execution is no row while its lease lives: the job's row is
-- its record (the runner, the token, the start: claimed_at), and writing it at the claim
-- and again at the outcome cost a tenth of a job's server CPU (migration 0025). So
-- whatever ends such a lease records it, in the transaction that ends the lease and
-- before it does: the outcome writes it ended (complete_unchecked); every other end
-- (cancel, release, a reported loss, expiry, a confirmed stop) calls this first, which
-- writes it open, as the handler may still run (a frozen one whose lease expired): it
-- stays open until its stop is confirmed or its stale outcome arrives. The caller holds
-- the jobs locked. Jobs that are not a handler's, not live, or recorded already: nothing.
-- A handler's execution has no run id: that names a launched process (migration 0026).
CREATE OR REPLACE FUNCTION fleetq.record_handler_runs(p_jobs bigint[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO fleetq.executions
        (job_id, lease_version, runner_id, node, run_id, launched_at, start_reported_at)
    SELECT j.id, j.lease_version, j.lease_owner, r.node, NULL::uuid, j.claimed_at,
           j.claimed_at
    FROM fleetq.jobs j
    JOIN fleetq.operations o ON o.project = j.project AND o.name = j.operation
    JOIN fleetq.runners r ON r.id = j.lease_owner
    WHERE j.id = ANY (p_jobs) AND j.state IN ('claimed', 'running') AND o.handler IS NOT NULL
    ORDER BY j.id
    ON CONFLICT (job_id, lease_version) DO NOTHING;
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.record_outcomes(p_jobs bigint[], p_exit_codes integer[], p_log_tails text[], p_prepare_ms integer[], p_run_ms integer[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_jobs bigint[];
    v_projects text[];
    v_commits text[];
    v_operations text[];
    v_states text[];
    v_reasons text[];
    v_tasks text[];
    v_codes integer[];
    v_tails text[];
    v_prepare integer[];
    v_run integer[];
BEGIN
    SELECT array_agg(j.id), array_agg(j.project), array_agg(j.commit_sha),
           array_agg(j.operation), array_agg(j.state), array_agg(j.failure_reason),
           array_agg(j.task_id), array_agg(t.exit_code), array_agg(t.log_tail),
           array_agg(t.prepare_ms), array_agg(t.run_ms)
    INTO v_jobs, v_projects, v_commits, v_operations, v_states, v_reasons, v_tasks, v_codes,
         v_tails, v_prepare, v_run
    FROM unnest(p_jobs, p_exit_codes, p_log_tails, p_prepare_ms, p_run_ms)
         AS t(job_id, exit_code, log_tail, prepare_ms, run_ms)
    JOIN fleetq.jobs j ON j.id = t.job_id;
    PERFORM fleetq.record_ended(v_jobs, v_projects, v_commits, v_operations, v_states,
                                v_reasons, v_tasks, v_codes, v_tails, v_prepare, v_run,
                                NULL);
END;
$function$;

-- The verdict's word for a job's end: `failed` only when the check ran and failed (a
-- non-zero exit, a timeout, a signal, a handler's exception); any other failure is an
-- `error`, the check could not run (launch or staging failed, its run was lost, the
-- runner failed): a CI gate must not blame a commit for its fleet. A new reason is an
-- error until it is named here.
CREATE OR REPLACE FUNCTION fleetq.verdict_of(p_state text, p_reason text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE
        WHEN p_state = 'succeeded' THEN 'passed'
        WHEN p_state = 'failed'
             AND coalesce(p_reason, 'exit') NOT IN ('exit', 'timeout', 'signal', 'exception')
            THEN 'error'
        ELSE p_state
    END
$function$;

-- What every ending leaves, from the ended jobs' own fields (the caller has them: the
-- outcome path from the update that ended them, so it reads no job again): the verdict,
-- the task's notification, and the jobs waiting on these settled.
-- A verdict's provenance as the runner sent it, stored: its environment and its
-- operation's definition, the same for thousands of verdicts, kept once in
-- provenance_parts by their hash and named by it; the rest (staging, lockfiles, tests)
-- stays the verdict's own. Anything but an object of at most 64 KiB is not kept, and
-- the verdict says so: a runner's bug or a hostile token loses its provenance, never
-- the outcome.
CREATE OR REPLACE FUNCTION fleetq.provenance_kept(p_facts jsonb)
 RETURNS jsonb
 LANGUAGE plpgsql
 STRICT
AS $function$
DECLARE
    v_kept jsonb := p_facts;
    v_kind text;
    v_hash text;
BEGIN
    IF jsonb_typeof(p_facts) <> 'object' OR octet_length(p_facts::text) > 65536 THEN
        RETURN jsonb_build_object('dropped', 'not an object of at most 65536 bytes');
    END IF;
    FOREACH v_kind IN ARRAY ARRAY['environment', 'definition'] LOOP
        IF jsonb_typeof(p_facts -> v_kind) = 'object' THEN
            v_hash := encode(sha256(convert_to((p_facts -> v_kind)::text, 'UTF8')), 'hex');
            INSERT INTO fleetq.provenance_parts (hash, kind, body)
            VALUES (v_hash, v_kind, p_facts -> v_kind)
            ON CONFLICT (hash) DO NOTHING;
            v_kept := jsonb_set(v_kept, ARRAY[v_kind], to_jsonb(v_hash));
        END IF;
    END LOOP;
    RETURN v_kept;
END;
$function$;

-- A verdict's provenance as readers see it: the parts it names by hash put back, each
-- with its hash (two verdicts with one environment name one hash).
-- (plpgsql: the protocol files are applied to older schemas too, before 0041 made the
-- table, and only a plpgsql body is not checked against the tables when created)
CREATE OR REPLACE FUNCTION fleetq.provenance_whole(p_kept jsonb)
 RETURNS jsonb
 LANGUAGE plpgsql
 STABLE STRICT
AS $function$
BEGIN
    RETURN p_kept || coalesce(
        (SELECT jsonb_object_agg(p.kind, p.body || jsonb_build_object('hash', p.hash))
         FROM fleetq.provenance_parts p
         WHERE p.hash IN (p_kept ->> 'environment', p_kept ->> 'definition')),
        '{}');
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.record_ended(p_jobs bigint[], p_projects text[], p_commits text[], p_operations text[], p_states text[], p_reasons text[], p_tasks text[], p_exit_codes integer[], p_log_tails text[], p_prepare_ms integer[], p_run_ms integer[], p_provenance jsonb[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF coalesce(cardinality(p_jobs), 0) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO fleetq.verdicts
        (job_id, project, commit_sha, operation, verdict, exit_code, reason, log_tail,
         prepare_ms, run_ms, provenance)
    SELECT t.job_id, t.project, t.commit_sha, t.operation, fleetq.verdict_of(t.state, t.reason),
           t.exit_code, t.reason, coalesce(t.log_tail, ''), t.prepare_ms, t.run_ms,
           fleetq.provenance_kept(t.provenance)
    FROM unnest(p_jobs, p_projects, p_commits, p_operations, p_states, p_reasons,
                p_exit_codes, p_log_tails, p_prepare_ms, p_run_ms, p_provenance)
         AS t(job_id, project, commit_sha, operation, state, reason, exit_code, log_tail,
              prepare_ms, run_ms, provenance)
    ON CONFLICT (job_id) DO NOTHING;  -- one outcome per job: a repeat changes nothing

    INSERT INTO fleetq.task_notifications (task_id, job_id, state, verdict)
    SELECT t.task_id, t.job_id, t.state, fleetq.verdict_of(t.state, t.reason)
    FROM unnest(p_jobs, p_tasks, p_states, p_reasons) AS t(job_id, task_id, state, reason)
    WHERE t.task_id IS NOT NULL;

    PERFORM fleetq.settle_dependents(p_jobs);  -- the jobs waiting on these

    -- whoever waits on these (fleetq wait) hears they ended; none waiting, no NOTIFY
    PERFORM pg_notify('fleetq_done', w.job_id::text)
    FROM (SELECT DISTINCT job_id FROM fleetq.job_watchers WHERE job_id = ANY (p_jobs)) w;
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.heartbeat_unchecked(p_runner text, p_jobs bigint[], p_versions bigint[])
 RETURNS TABLE(job_id bigint, status text, lease_expires_at timestamp with time zone)
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_locked bigint[];
    v_ids bigint[];
    v_expiry timestamptz[];
    v_stale bigint[];
    v_stale_versions bigint[];
    v_lease interval := fleetq.setting_seconds('lease_seconds');
BEGIN
    -- Only this runner's live leases are locked: a row of anyone else's is never held,
    -- not even for the length of this call (a runner login renewing another's job in an
    -- open transaction held it, and that job's own renewals skipped it until its holder
    -- fenced itself). NO KEY UPDATE, the update's own mode: it does not conflict with
    -- the KEY SHARE a dependent submit (--after) holds on the job until it commits.
    SELECT array_agg(l.id) INTO v_locked
    FROM (SELECT j.id FROM fleetq.jobs j
          JOIN unnest(p_jobs, p_versions) AS i(id, version) ON i.id = j.id
          WHERE j.lease_owner = p_runner AND j.lease_version = i.version
          ORDER BY j.id FOR NO KEY UPDATE OF j SKIP LOCKED) l;
    WITH renewed AS (
        UPDATE fleetq.jobs j
        SET lease_expires_at = clock_timestamp() + v_lease
        FROM unnest(p_jobs, p_versions) AS i(id, version)
        -- the locked rows are this runner's leases under the tokens it named (the
        -- owner and token guard is the lock's WHERE above)
        WHERE j.id = i.id AND j.id = ANY (coalesce(v_locked, '{}'))
          AND j.state IN ('claimed', 'running')
        RETURNING j.id, j.lease_expires_at
    )
    SELECT array_agg(renewed.id), array_agg(renewed.lease_expires_at) INTO v_ids, v_expiry
    FROM renewed;

    -- stale: rows that are no longer ours, as this statement reads them (one we hold
    -- that another transaction has locked is busy: not known)
    SELECT array_agg(i.id), array_agg(i.version) INTO v_stale, v_stale_versions
    FROM unnest(p_jobs, p_versions) AS i(id, version)
    WHERE i.id <> ALL (coalesce(v_ids, '{}'))
      AND (i.id = ANY (coalesce(v_locked, '{}'))
           OR NOT EXISTS (SELECT 1 FROM fleetq.jobs j
                          WHERE j.id = i.id AND j.lease_owner = p_runner
                            AND j.lease_version = i.version
                            AND j.state IN ('claimed', 'running')));
    PERFORM fleetq.note_stale(p_runner, 'heartbeat', v_stale, v_stale_versions);

    -- busy: ours under the token named, its row held by another transaction (the
    -- handler's ctx.transaction()). The runner counts it renewed, so it is renewed here,
    -- where the lock does not reach, and the reaper honours it: should the holder's
    -- session end, the row comes free with a lease as fresh as the runner's fence clock.
    INSERT INTO fleetq.busy_renewals AS b (job_id, lease_version, lease_expires_at)
    SELECT i.id, i.version, clock_timestamp() + v_lease
    FROM unnest(p_jobs, p_versions) AS i(id, version)
    WHERE i.id <> ALL (coalesce(v_ids, '{}')) AND i.id <> ALL (coalesce(v_stale, '{}'))
    ON CONFLICT (job_id) DO UPDATE
        SET lease_version = EXCLUDED.lease_version, lease_expires_at = EXCLUDED.lease_expires_at;

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
$function$;

CREATE OR REPLACE FUNCTION fleetq.heartbeat(p_runner text, p_jobs bigint[], p_versions bigint[])
 RETURNS TABLE(job_id bigint, status text, lease_expires_at timestamp with time zone)
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT * FROM fleetq.heartbeat_unchecked(fleetq.acting_runner(p_runner), p_jobs, p_versions)
$function$;

-- Launch times on the database's clock.
--
-- report_start recorded an execution's launched_at as the process start time the runner
-- reported. That time comes from the node (psutil derives it from the boot time, which
-- the kernel gives in whole seconds), so it could fall up to a second before the claim
-- that led to it, and overlap windows (measured against database-clock ends) came out
-- too long. The process start stays recorded as evidence of identity
-- (process_started_at); launched_at is now clamped between this lease's claim and the
-- start report, both database times. An adopted run still keeps its earlier start.
CREATE OR REPLACE FUNCTION fleetq.report_start_unchecked(p_runner text, p_job bigint, p_version bigint, p_node text, p_run_id uuid, p_pid integer, p_process_started_at timestamp with time zone, p_prepare_ms integer)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_claimed_at timestamptz;
BEGIN
    -- The locks the writes below take on their tables, taken before the job's row: a
    -- start report that has to wait on `executions` (an index built on it without
    -- CONCURRENTLY, a VACUUM FULL) waits holding no row. It waited holding its job's
    -- row, which the renewal skips (SKIP LOCKED), so a healthy run's lease went
    -- unrenewed for as long as the report waited, up to lock_timeout, and could fence
    -- itself. `jobs` before `executions`, the order of every other writer of both and of
    -- the migrations that alter both (0024): the other order deadlocked with them.
    LOCK TABLE fleetq.jobs, fleetq.executions IN ROW EXCLUSIVE MODE;
    -- The lease is extended, never shortened: the runner renews and fences it by the
    -- length its claim or last renewal answered, and a start report answers none (a
    -- lease setting lowered by `fleetq apply` since the claim takes effect at the next
    -- renewal, which says so).
    UPDATE fleetq.jobs
    SET state = 'running', started_at = clock_timestamp(), updated_at = clock_timestamp(),
        lease_expires_at = greatest(lease_expires_at,
                                    clock_timestamp() + fleetq.setting_seconds('lease_seconds'))
    WHERE id = p_job AND lease_owner = p_runner AND lease_version = p_version AND state = 'claimed'
    RETURNING claimed_at INTO v_claimed_at;
    IF FOUND THEN
        INSERT INTO fleetq.executions
            (job_id, lease_version, runner_id, node, run_id, pid, process_started_at,
             prepared_at, launched_at, start_reported_at, prepare_ms)
        VALUES
            (p_job, p_version, p_runner, p_node, p_run_id, p_pid, p_process_started_at,
             clock_timestamp(),
             least(clock_timestamp(),
                   greatest(coalesce(p_process_started_at, clock_timestamp()), v_claimed_at)),
             clock_timestamp(), p_prepare_ms);
        PERFORM fleetq.log_events('started', ARRAY[p_job], p_runner, ARRAY[p_version], NULL,
                                  jsonb_build_object('run_id', p_run_id, 'pid', p_pid,
                                                     'node', p_node));
        RETURN 'ok';
    END IF;
    IF EXISTS (SELECT 1 FROM fleetq.executions
               WHERE job_id = p_job AND lease_version = p_version AND runner_id = p_runner
                 AND run_id = p_run_id) THEN
        RETURN 'already';
    END IF;
    PERFORM fleetq.note_stale(p_runner, 'start', ARRAY[p_job], ARRAY[p_version]);
    RETURN 'stale';
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.report_start(p_runner text, p_job bigint, p_version bigint, p_node text, p_run_id uuid, p_pid integer, p_process_started_at timestamp with time zone, p_prepare_ms integer)
 RETURNS text
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT fleetq.report_start_unchecked(fleetq.acting_runner(p_runner), p_job, p_version,
                                         fleetq.checked_text(p_node, 'node'), p_run_id, p_pid,
                                         p_process_started_at, p_prepare_ms)
$function$;

-- Outcomes. Every row this path reads (jobs, executions, runners) it reads by key, and a
-- runner's connection caches the plans: planned while jobs was small (a fresh queue, the
-- first seconds of a burst), they were sequential scans and hash joins, kept after the
-- table had grown (until an ANALYZE; never, with autovacuum off), so each outcome batch
-- of a 20,000-job backlog read every job four times. Hence the planner settings below:
-- probe by key at any size (test_query_plans.py), and no JIT, which the disabled plans'
-- cost would otherwise trigger on every call. And plan once: the arrays are parameters,
-- so a plan for the actual arrays (one job: one row) always looked cheaper than the
-- generic one (a hundred), and every statement was planned again on every call.
-- The fence says "a live lease" as the lease columns (owner, token, expiry), not as
-- state IN ('claimed', 'running'): the same rows (CHECK jobs_check: those states exactly
-- when owner and expiry are set), but the state form also matched the partial indexes
-- of claimed and running jobs, and the plan read one of them whole on every call, with
-- every entry a claim has left there since the last VACUUM (test_query_plans.py).
CREATE OR REPLACE FUNCTION fleetq.complete_unchecked(p_runner text, p_jobs bigint[], p_versions bigint[], p_outcomes text[], p_exit_codes integer[], p_reasons text[], p_log_tails text[], p_prepare_ms integer[], p_run_ms integer[], p_ended_ago_ms integer[], p_facts jsonb[])
 RETURNS TABLE(job_id bigint, status text)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
DECLARE
    v_locked bigint[];
    v_busy bigint[];  -- this runner's leases another transaction holds: not known
    v_done bigint[];
    v_lanes text[];
    v_memory integer[];
    v_cpu integer[];
    v_versions bigint[];
    v_stale bigint[];
    v_stale_versions bigint[];
    v_already bigint[];
    v_states text[];
    v_projects text[];
    v_commits text[];
    v_operations text[];
    v_failures text[];
    v_tasks text[];
    v_codes integer[];
    v_tails text[];
    v_prepare integer[];
    v_run integer[];
    v_agos integer[];
    v_claimed timestamptz[];
    v_recorded bigint[];
    v_retried bigint[];
    v_facts jsonb[];
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_outcomes) o WHERE o NOT IN ('succeeded', 'failed', 'refused')) THEN
        RAISE EXCEPTION 'an outcome is succeeded, failed or refused' USING ERRCODE = 'FQ003';
    END IF;
    -- this runner's leases only: another's row is never held, not even for this call
    -- (a retried outcome whose first attempt committed is answered from what it wrote)
    -- (NO KEY: a dependent submit's KEY SHARE never holds an outcome up; settle_dependents)
    -- One that another transaction holds is waited for a moment only (fleetq.lock_jobs),
    -- then answered busy, and the runner tries it again apart: a submitter cancelling its
    -- own running job in a transaction it kept open held the whole batch, every outcome
    -- of that runner, and so its slots, behind that one row.
    v_locked := fleetq.lock_jobs(p_jobs, p_runner, NULL);

    -- One pass over the jobs: the update that ends them returns all that the rest of
    -- the outcome writes (reading them again cost a probe per job per statement).
    WITH input AS (
        SELECT * FROM unnest(p_jobs, p_versions, p_outcomes, p_reasons, p_exit_codes,
                             p_log_tails, p_prepare_ms, p_run_ms, p_ended_ago_ms, p_facts)
                 AS i(id, version, outcome, reason, exit_code, log_tail, prepare_ms, run_ms,
                      ago, facts)
    ),
    done AS (
        UPDATE fleetq.jobs j
        SET state = i.outcome,
            failure_reason = CASE WHEN i.outcome = 'succeeded' THEN NULL
                                  ELSE coalesce(i.reason, 'exit') END,
            finished_at = clock_timestamp(),
            updated_at = clock_timestamp(),
            lease_owner = NULL,
            lease_expires_at = NULL,
            reserved_on = NULL,
            released_by = p_runner,
            released_version = i.version,
            released_kind = 'outcome'
        FROM input i
        WHERE j.id = i.id AND j.lease_owner = p_runner AND j.lease_version = i.version
          AND j.lease_expires_at IS NOT NULL AND i.id = ANY (v_locked)
        RETURNING j.id, j.lane, j.memory_mb, j.cpu_millis, j.lease_version, j.state,
                  j.project, j.commit_sha, j.operation, j.failure_reason, j.task_id,
                  j.claimed_at, i.exit_code, i.log_tail, i.prepare_ms, i.run_ms, i.ago,
                  i.facts
    )
    SELECT array_agg(d.id), array_agg(d.lane), array_agg(d.memory_mb), array_agg(d.cpu_millis),
           array_agg(d.lease_version), array_agg(d.state), array_agg(d.project),
           array_agg(d.commit_sha), array_agg(d.operation), array_agg(d.failure_reason),
           array_agg(d.task_id), array_agg(d.exit_code), array_agg(d.log_tail),
           array_agg(d.prepare_ms), array_agg(d.run_ms), array_agg(d.ago),
           array_agg(d.claimed_at), array_agg(d.facts)
    INTO v_done, v_lanes, v_memory, v_cpu, v_versions, v_states, v_projects, v_commits,
         v_operations, v_failures, v_tasks, v_codes, v_tails, v_prepare, v_run, v_agos,
         v_claimed, v_facts
    FROM done d;

    IF v_done IS NOT NULL THEN
        -- a live lease held its owner's capacity (CHECK on jobs): give it back
        PERFORM fleetq.give_back(array_fill(p_runner, ARRAY[cardinality(v_done)]), v_lanes,
                                 v_memory, v_cpu);
        -- The execution's end. A handler's is written now, whole (fleetq.record_handler_runs
        -- says why); a command's row exists since its start report (one that never
        -- launched has none and gets none), and so may a handler's that an earlier end of
        -- its lease wrote open: those are ended by the update, which a batch of handlers
        -- whose rows were all written here skips.
        WITH recorded AS (
            INSERT INTO fleetq.executions
                (job_id, lease_version, runner_id, node, run_id, launched_at,
                 start_reported_at, ended_at, end_measured, exit_code, run_ms)
            SELECT i.id, i.version, p_runner,
                   (SELECT r.node FROM fleetq.runners r WHERE r.id = p_runner),
                   NULL::uuid, i.claimed_at, i.claimed_at,
                   fleetq.measured_end(i.claimed_at, i.ago), i.ago IS NOT NULL, i.exit_code,
                   i.run_ms
            FROM unnest(v_done, v_versions, v_codes, v_run, v_agos, v_claimed, v_projects,
                        v_operations)
                 AS i(id, version, exit_code, run_ms, ago, claimed_at, project, operation)
            JOIN fleetq.operations o ON o.project = i.project AND o.name = i.operation
            WHERE o.handler IS NOT NULL
            ON CONFLICT (job_id, lease_version) DO NOTHING
            RETURNING job_id
        )
        SELECT array_agg(r.job_id) INTO v_recorded FROM recorded r;
        IF coalesce(cardinality(v_recorded), 0) < cardinality(v_done) THEN
            UPDATE fleetq.executions e
            SET ended_at = coalesce(e.ended_at, fleetq.measured_end(e.launched_at, i.ago)),
                end_measured = CASE WHEN e.ended_at IS NULL THEN i.ago IS NOT NULL
                                    ELSE e.end_measured END,
                exit_code = i.exit_code, run_ms = i.run_ms
            FROM unnest(v_done, v_versions, v_codes, v_run, v_agos)
                 AS i(id, version, exit_code, run_ms, ago)
            WHERE e.job_id = i.id AND e.lease_version = i.version
              AND i.id <> ALL (coalesce(v_recorded, '{}'));
        END IF;
        -- a failed attempt its operation retries waits for the next one instead of ending
        -- (nothing more is read when no outcome failed)
        v_retried := CASE WHEN 'failed' = ANY (p_outcomes)
                          THEN fleetq.schedule_retries(v_done, v_codes) ELSE '{}' END;
        IF cardinality(v_retried) = 0 THEN
            PERFORM fleetq.record_ended(v_done, v_projects, v_commits, v_operations, v_states,
                                        v_failures, v_tasks, v_codes, v_tails, v_prepare,
                                        v_run, v_facts);
        ELSE
            PERFORM fleetq.record_ended(array_agg(t.id), array_agg(t.project),
                                        array_agg(t.commit_sha), array_agg(t.operation),
                                        array_agg(t.state), array_agg(t.reason),
                                        array_agg(t.task), array_agg(t.code),
                                        array_agg(t.tail), array_agg(t.prepare),
                                        array_agg(t.run), array_agg(t.facts))
            FROM unnest(v_done, v_projects, v_commits, v_operations, v_states, v_failures,
                        v_tasks, v_codes, v_tails, v_prepare, v_run, v_facts)
                 AS t(id, project, commit_sha, operation, state, reason, task, code, tail,
                      prepare, run, facts)
            WHERE t.id <> ALL (v_retried);
        END IF;
        INSERT INTO fleetq.events (kind, job_id, runner_id, lease_version, detail)
        SELECT CASE WHEN t.id = ANY (v_retried) THEN 'failed_attempt' ELSE t.state END,
               t.id, p_runner, t.version,
               jsonb_build_object('exit_code', t.exit_code, 'reason', t.reason)
        FROM unnest(v_done, v_states, v_versions, v_codes, v_failures)
             AS t(id, state, version, exit_code, reason);
    END IF;

    -- Not done: this same outcome committed earlier (reply lost), busy, or stale.
    -- The usual batch is all done: answer it without reading anything more.
    IF coalesce(cardinality(v_done), 0) = cardinality(p_jobs) THEN
        RETURN QUERY SELECT i.id, 'ok'::text FROM unnest(p_jobs) WITH ORDINALITY AS i(id, n)
                     ORDER BY i.n;
        RETURN;
    END IF;
    SELECT array_agg(j.id) INTO v_busy
    FROM fleetq.jobs j
    WHERE j.id = ANY (p_jobs) AND j.lease_owner = p_runner AND j.id <> ALL (v_locked);
    SELECT array_agg(j.id) INTO v_already
    FROM fleetq.jobs j
    JOIN unnest(p_jobs, p_versions) AS i(id, version) ON i.id = j.id
    WHERE j.id <> ALL (coalesce(v_done, '{}'))
      AND j.released_by = p_runner AND j.released_version = i.version
      AND j.lease_version = i.version AND j.released_kind = 'outcome';
    SELECT array_agg(i.id), array_agg(i.version) INTO v_stale, v_stale_versions
    FROM unnest(p_jobs, p_versions) AS i(id, version)
    WHERE i.id <> ALL (coalesce(v_done, '{}')) AND i.id <> ALL (coalesce(v_already, '{}'))
      AND i.id <> ALL (coalesce(v_busy, '{}'));
    PERFORM fleetq.note_stale(p_runner, 'outcome', v_stale, v_stale_versions);
    -- A stale outcome changes no job, but it is evidence: the writer's own execution
    -- under that token has ended (a zombie's run, say), which closes its overlap window.
    UPDATE fleetq.executions e
    SET ended_at = fleetq.measured_end(e.launched_at, i.ago), end_measured = i.ago IS NOT NULL,
        exit_code = i.exit_code, run_ms = i.run_ms
    FROM unnest(p_jobs, p_versions, p_exit_codes, p_run_ms, p_ended_ago_ms)
         AS i(id, version, exit_code, run_ms, ago)
    WHERE e.job_id = i.id AND e.lease_version = i.version AND e.runner_id = p_runner
      AND e.ended_at IS NULL AND i.id = ANY (coalesce(v_stale, '{}'));

    RETURN QUERY
    SELECT i.id,
           CASE WHEN i.id = ANY (coalesce(v_done, '{}')) THEN 'ok'
                WHEN i.id = ANY (coalesce(v_already, '{}')) THEN 'already'
                WHEN i.id = ANY (coalesce(v_busy, '{}')) THEN 'busy'
                ELSE 'stale' END
    FROM unnest(p_jobs) WITH ORDINALITY AS i(id, n)
    ORDER BY i.n;
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.complete(p_runner text, p_jobs bigint[], p_versions bigint[], p_outcomes text[], p_exit_codes integer[], p_reasons text[], p_log_tails text[], p_prepare_ms integer[], p_run_ms integer[], p_ended_ago_ms integer[], p_facts jsonb[])
 RETURNS TABLE(job_id bigint, status text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN  -- plpgsql: its statement is planned once per connection, not on every call
    RETURN QUERY
    SELECT * FROM fleetq.complete_unchecked(fleetq.acting_runner(p_runner), p_jobs, p_versions,
                                            p_outcomes, p_exit_codes,
                                            fleetq.clipped(p_reasons, 2000),
                                            fleetq.clipped(p_log_tails, 8192, true),
                                            p_prepare_ms, p_run_ms, p_ended_ago_ms,
                                            p_facts);
END;
$function$;

-- Outcomes, then a claim for the room they free, in one transaction (issue 18): where a
-- runner runs few jobs at once, each outcome frees a slot that a claim fills right
-- after, and as two transactions each job cost a commit, a transaction id and a round
-- trip more. The claim is the claim as any (same id retried: what it took is returned);
-- it sees the room the outcomes gave back, as it runs after them. Rows: kind 'outcome'
-- (job_id, status) in the order given, then kind 'claim' (a claim's columns).
CREATE OR REPLACE FUNCTION fleetq.complete_and_claim(p_runner text, p_jobs bigint[], p_versions bigint[], p_outcomes text[], p_exit_codes integer[], p_reasons text[], p_log_tails text[], p_prepare_ms integer[], p_run_ms integer[], p_ended_ago_ms integer[], p_lane text, p_limit integer, p_claim_id uuid, p_facts jsonb[])
 RETURNS TABLE(kind text, job_id bigint, status text, lease_version bigint, lease_expires_at timestamp with time zone, project text, operation text, commit_sha text, requested_node text, payload jsonb, task_id text, timeout_s integer, memory_mb integer, cpu_millis integer, priority_class smallint, reassign_count integer, lost_count smallint, traceparent text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    v_runner text := fleetq.acting_runner(p_runner);
BEGIN
    RETURN QUERY
    SELECT 'outcome'::text, o.job_id, o.status, NULL::bigint, NULL::timestamptz, NULL::text,
           NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::text, NULL::integer,
           NULL::integer, NULL::integer, NULL::smallint, NULL::integer, NULL::smallint,
           NULL::text
    FROM fleetq.complete_unchecked(v_runner, p_jobs, p_versions, p_outcomes, p_exit_codes,
                                   fleetq.clipped(p_reasons, 2000),
                                   fleetq.clipped(p_log_tails, 8192, true), p_prepare_ms,
                                   p_run_ms, p_ended_ago_ms, p_facts) o;
    IF p_limit > 0 THEN
        -- a refill: its claim does not wake the lane when it fills its room (claim.sql);
        -- local to this call (the function's SET clause restores settings on exit)
        PERFORM set_config('fleetq.refill', 'on', true);
        RETURN QUERY
        SELECT 'claim'::text, c.job_id, NULL::text, c.lease_version, c.lease_expires_at,
               c.project, c.operation, c.commit_sha, c.requested_node, c.payload, c.task_id,
               c.timeout_s, c.memory_mb, c.cpu_millis, c.priority_class, c.reassign_count,
               c.lost_count, c.traceparent
        FROM fleetq.claim_unchecked(v_runner, p_lane, p_limit, p_claim_id) c;
    END IF;
END;
$function$;

-- The signatures before provenance (0041), for a runner not yet upgraded: its outcomes
-- are recorded as before, with no provenance.
CREATE OR REPLACE FUNCTION fleetq.complete(p_runner text, p_jobs bigint[], p_versions bigint[], p_outcomes text[], p_exit_codes integer[], p_reasons text[], p_log_tails text[], p_prepare_ms integer[], p_run_ms integer[], p_ended_ago_ms integer[])
 RETURNS TABLE(job_id bigint, status text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    RETURN QUERY
    SELECT * FROM fleetq.complete(p_runner, p_jobs, p_versions, p_outcomes, p_exit_codes,
                                  p_reasons, p_log_tails, p_prepare_ms, p_run_ms,
                                  p_ended_ago_ms, NULL::jsonb[]);
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.complete_and_claim(p_runner text, p_jobs bigint[], p_versions bigint[], p_outcomes text[], p_exit_codes integer[], p_reasons text[], p_log_tails text[], p_prepare_ms integer[], p_run_ms integer[], p_ended_ago_ms integer[], p_lane text, p_limit integer, p_claim_id uuid)
 RETURNS TABLE(kind text, job_id bigint, status text, lease_version bigint, lease_expires_at timestamp with time zone, project text, operation text, commit_sha text, requested_node text, payload jsonb, task_id text, timeout_s integer, memory_mb integer, cpu_millis integer, priority_class smallint, reassign_count integer, lost_count smallint, traceparent text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    RETURN QUERY
    SELECT * FROM fleetq.complete_and_claim(p_runner, p_jobs, p_versions, p_outcomes,
                                            p_exit_codes, p_reasons, p_log_tails,
                                            p_prepare_ms, p_run_ms, p_ended_ago_ms, p_lane,
                                            p_limit, p_claim_id, NULL::jsonb[]);
END;
$function$;

-- their implementations before 0041, replaced by the ones above (one transaction)
DROP FUNCTION IF EXISTS fleetq.complete_unchecked(text, bigint[], bigint[], text[], integer[],
                                                  text[], text[], integer[], integer[],
                                                  integer[]);
DROP FUNCTION IF EXISTS fleetq.record_ended(bigint[], text[], text[], text[], text[], text[],
                                            text[], integer[], text[], integer[], integer[]);

CREATE OR REPLACE FUNCTION fleetq.release_unchecked(p_runner text, p_job bigint, p_version bigint, p_reason text, p_fenced boolean DEFAULT false, p_ended_ago_ms integer DEFAULT NULL::integer)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    j fleetq.jobs%ROWTYPE;
    v_answer text;
    v_fail boolean;
BEGIN
    v_answer := fleetq.hand_back_guard(p_runner, p_job, p_version, 'release');
    IF v_answer IS NOT NULL THEN
        RETURN v_answer;
    END IF;
    PERFORM fleetq.record_handler_runs(ARRAY[p_job]);
    SELECT * INTO j FROM fleetq.jobs WHERE id = p_job;
    v_fail := p_fenced AND j.reassign_count + 1 > fleetq.setting_int('reassignment_cap');
    UPDATE fleetq.jobs
    SET state = CASE WHEN v_fail THEN 'failed' ELSE 'queued' END,
        failure_reason = CASE WHEN v_fail THEN 'reassignments_exhausted' END,
        finished_at = CASE WHEN v_fail THEN clock_timestamp() END,
        reassign_count = reassign_count + CASE WHEN p_fenced THEN 1 ELSE 0 END,
        lease_owner = NULL, lease_expires_at = NULL, reserved_on = NULL,
        claim_id = NULL, released_by = p_runner, released_version = p_version,
        released_kind = 'release', updated_at = clock_timestamp()
    WHERE id = p_job;
    PERFORM fleetq.give_back(ARRAY[p_runner], ARRAY[j.lane], ARRAY[j.memory_mb], ARRAY[j.cpu_millis]);
    UPDATE fleetq.executions
    SET ended_at = coalesce(ended_at, fleetq.measured_end(launched_at, p_ended_ago_ms)),
        end_measured = CASE WHEN ended_at IS NULL THEN p_ended_ago_ms IS NOT NULL
                            ELSE end_measured END,
        stop_reason = coalesce(stop_reason, CASE WHEN p_fenced THEN 'self_fenced' ELSE 'shutdown' END),
        stop_confirmed = true
    WHERE job_id = p_job AND lease_version = p_version;
    PERFORM fleetq.log_events('released', ARRAY[p_job], p_runner, ARRAY[p_version], NULL,
                              jsonb_build_object('reason', p_reason, 'fenced', p_fenced));
    IF v_fail THEN
        PERFORM fleetq.record_outcomes(ARRAY[p_job], ARRAY[NULL::integer], ARRAY[NULL::text],
                                       ARRAY[NULL::integer], ARRAY[NULL::integer]);
        PERFORM fleetq.log_events('failed', ARRAY[p_job], p_runner, ARRAY[p_version], NULL,
                                  '{"reason": "reassignments_exhausted"}');
        RETURN 'failed';
    END IF;
    PERFORM pg_notify('fleetq_work', j.lane);
    RETURN 'ok';
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.release(p_runner text, p_job bigint, p_version bigint, p_reason text, p_fenced boolean DEFAULT false, p_ended_ago_ms integer DEFAULT NULL::integer)
 RETURNS text
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT fleetq.release_unchecked(fleetq.acting_runner(p_runner), p_job, p_version,
                                    left(p_reason, 2000), p_fenced, p_ended_ago_ms)
$function$;

-- An explicit loss (DESIGN §1.5): the first requeues, the second fails with reason 'lost'.
-- Lease expiry is a different path (reap) and never touches lost_count.
CREATE OR REPLACE FUNCTION fleetq.report_lost_unchecked(p_runner text, p_job bigint, p_version bigint, p_reason text)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    j fleetq.jobs%ROWTYPE;
    v_requeue boolean;
    v_answer text;
BEGIN
    v_answer := fleetq.hand_back_guard(p_runner, p_job, p_version, 'lost');
    IF v_answer IS NOT NULL THEN
        RETURN v_answer;
    END IF;
    PERFORM fleetq.record_handler_runs(ARRAY[p_job]);
    SELECT * INTO j FROM fleetq.jobs WHERE id = p_job;
    v_requeue := j.lost_count = 0;
    UPDATE fleetq.jobs
    SET state = CASE WHEN v_requeue THEN 'queued' ELSE 'failed' END,
        failure_reason = CASE WHEN v_requeue THEN NULL ELSE 'lost' END,
        finished_at = CASE WHEN v_requeue THEN NULL ELSE clock_timestamp() END,
        lost_count = lost_count + 1,
        lease_owner = NULL, lease_expires_at = NULL, reserved_on = NULL, claim_id = NULL,
        released_by = p_runner, released_version = p_version, released_kind = 'lost',
        updated_at = clock_timestamp()
    WHERE id = p_job;
    PERFORM fleetq.give_back(ARRAY[p_runner], ARRAY[j.lane], ARRAY[j.memory_mb], ARRAY[j.cpu_millis]);
    UPDATE fleetq.executions
    SET ended_at = clock_timestamp(), stop_reason = 'lost'
    WHERE job_id = p_job AND lease_version = p_version AND ended_at IS NULL;
    PERFORM fleetq.log_events('lost', ARRAY[p_job], p_runner, ARRAY[p_version], NULL,
                              jsonb_build_object('reason', p_reason, 'requeued', v_requeue));
    IF v_requeue THEN
        PERFORM pg_notify('fleetq_work', j.lane);
        RETURN 'requeued';
    END IF;
    PERFORM fleetq.record_outcomes(ARRAY[p_job], ARRAY[NULL::integer], ARRAY[NULL::text],
                                   ARRAY[NULL::integer], ARRAY[NULL::integer]);
    PERFORM fleetq.log_events('failed', ARRAY[p_job], p_runner, ARRAY[p_version], NULL,
                              '{"reason": "lost"}');
    RETURN 'failed';
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.report_lost(p_runner text, p_job bigint, p_version bigint, p_reason text)
 RETURNS text
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT fleetq.report_lost_unchecked(fleetq.acting_runner(p_runner), p_job, p_version,
                                        left(p_reason, 2000))
$function$;

CREATE OR REPLACE FUNCTION fleetq.confirm_stop_unchecked(p_runner text, p_job bigint, p_version bigint, p_signal integer, p_reason text, p_ended_ago_ms integer DEFAULT NULL::integer)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    j fleetq.jobs%ROWTYPE;
    v_cancel_ended_it boolean;
    v_reason text;
    v_recorded text;
BEGIN
    -- The job's row is locked only while this lease still holds it (owner, or the room
    -- a cancel left reserved): a lease that moved on is another runner's row, never held
    -- here. A stop is this runner's to confirm only for a (job, token) it was granted.
    SELECT * INTO j FROM fleetq.jobs
    WHERE id = p_job AND lease_version = p_version
      AND (lease_owner = p_runner OR reserved_on = p_runner)
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        SELECT * INTO j FROM fleetq.jobs WHERE id = p_job;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'unknown job %', p_job USING ERRCODE = 'FQ004';
        END IF;
        IF NOT fleetq.was_granted(p_runner, p_job, p_version) THEN
            RETURN 'stale';
        END IF;
    END IF;
    IF j.lease_owner = p_runner AND j.lease_version = p_version THEN
        PERFORM fleetq.record_handler_runs(ARRAY[p_job]);  -- a stop under a live lease
    END IF;
    -- A cancel ended this very lease: it keeps the lease's room reserved until this stop
    -- (an expiry, a loss or a release gives the room back, and a claim raises the version).
    v_cancel_ended_it := j.state = 'cancelled' AND j.reserved_on = p_runner
                         AND j.lease_version = p_version;
    -- A runner that finds its lease gone says cancelled or superseded from what it can
    -- see (the job's state now); the database knows which ended the lease.
    v_reason := CASE WHEN p_reason = 'superseded' AND v_cancel_ended_it THEN 'cancelled'
                     WHEN p_reason = 'cancelled' AND j.lease_version <> p_version
                         THEN 'superseded'
                     ELSE p_reason END;
    UPDATE fleetq.executions
    SET ended_at = coalesce(ended_at, fleetq.measured_end(launched_at, p_ended_ago_ms)),
        end_measured = CASE WHEN ended_at IS NULL THEN p_ended_ago_ms IS NOT NULL
                            ELSE end_measured END,
        signal = p_signal,
        -- the first confirmation's reason stands: a retry whose first attempt committed
        -- no longer sees the reservation the cancel kept
        stop_reason = CASE WHEN stop_confirmed THEN stop_reason ELSE v_reason END,
        stop_confirmed = true
    WHERE job_id = p_job AND lease_version = p_version AND runner_id = p_runner
    RETURNING stop_reason INTO v_recorded;
    IF v_cancel_ended_it THEN
        UPDATE fleetq.jobs SET reserved_on = NULL, updated_at = clock_timestamp() WHERE id = p_job;
        PERFORM fleetq.give_back(ARRAY[p_runner], ARRAY[j.lane], ARRAY[j.memory_mb],
                                 ARRAY[j.cpu_millis]);
    END IF;
    PERFORM fleetq.log_events('stopped', ARRAY[p_job], p_runner, ARRAY[p_version], NULL,
                              jsonb_build_object('reason', coalesce(v_recorded, v_reason),
                                                 'signal', p_signal));
    RETURN 'ok';
END;
$function$;

CREATE OR REPLACE FUNCTION fleetq.confirm_stop(p_runner text, p_job bigint, p_version bigint, p_signal integer, p_reason text, p_ended_ago_ms integer DEFAULT NULL::integer)
 RETURNS text
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT fleetq.confirm_stop_unchecked(fleetq.acting_runner(p_runner), p_job, p_version,
                                         p_signal, left(p_reason, 2000), p_ended_ago_ms)
$function$;

-- ---------------------------------------------------------------------------------------
-- The fenced ledger (DESIGN §1.3): a resource that rejects a token lower than the
-- highest it has seen for a key. Equal tokens pass: the same holder may write twice.
CREATE OR REPLACE FUNCTION fleetq.fenced_write_unchecked(p_key text, p_job bigint, p_token bigint, p_value jsonb)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_accepted boolean;
BEGIN
    INSERT INTO fleetq.fenced_ledger AS f (key, highest_token, job_id, value)
    VALUES (p_key, p_token, p_job, coalesce(p_value, '{}'))
    ON CONFLICT (key) DO UPDATE SET
        highest_token = EXCLUDED.highest_token, job_id = EXCLUDED.job_id,
        value = EXCLUDED.value, updated_at = clock_timestamp()
    WHERE f.highest_token <= EXCLUDED.highest_token
    RETURNING true INTO v_accepted;
    v_accepted := coalesce(v_accepted, false);
    INSERT INTO fleetq.fenced_writes (key, job_id, token, value, accepted)
    VALUES (p_key, p_job, p_token, coalesce(p_value, '{}'), v_accepted);
    RETURN v_accepted;
END;
$function$;

-- The fenced ledger, written by a handler: a runner login writes only under a token it
-- was granted for that job (its own claim), so it cannot forge a newer one.
CREATE OR REPLACE FUNCTION fleetq.fenced_write(p_key text, p_job bigint, p_token bigint, p_value jsonb)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    c record;
BEGIN
    SELECT * INTO c FROM fleetq.require(ARRAY['runner']);
    IF c.kind = 'runner' AND NOT fleetq.was_granted(c.subject, p_job, p_token) THEN
        RAISE EXCEPTION 'runner % never held job % under token %', c.subject, p_job, p_token
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN fleetq.fenced_write_unchecked(p_key, p_job, p_token, p_value);
END;
$function$;

-- Append one chunk of a run's output, which starts at byte `p_start` of it. Only the
-- runner that claimed that (job, token) may; the lease may have moved on since (a
-- cancelled or fenced run's last words are kept). A retried chunk (lost reply) is
-- written once. A run keeps its head (the chunks of its first 64 KiB: what ran) and its
-- newest chunks up to output_keep_kib; the answer is that budget in bytes, so the
-- runner skips ahead to it when it falls behind instead of shipping what is dropped.
CREATE OR REPLACE FUNCTION fleetq.append_output(p_runner text, p_job bigint, p_version bigint, p_seq integer, p_start bigint, p_data bytea)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    v_runner text := fleetq.acting_runner(p_runner);
    v_keep bigint := coalesce(fleetq.setting_int('output_keep_kib'), 1024)::bigint * 1024;
    v_head constant bigint := 65536;
BEGIN
    IF NOT fleetq.was_granted(v_runner, p_job, p_version) THEN
        RAISE EXCEPTION 'runner % never claimed job % under token %', v_runner, p_job,
                        p_version
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO fleetq.job_output (job_id, lease_version, seq, start_byte, data)
    VALUES (p_job, p_version, p_seq, p_start, p_data)
    ON CONFLICT (job_id, lease_version, seq) DO NOTHING;
    -- Keep the head, the chunks that start in the first 64 KiB while those before them
    -- add up to less than that (a runner that said every chunk starts at 0 kept them all
    -- as head: 124 MB of one job), and past it the newest chunks whose sizes add up to
    -- at most the budget.
    DELETE FROM fleetq.job_output o
    USING (SELECT k.seq
           FROM (SELECT c.seq, coalesce(c.start_byte, v_head) < v_head AS head,
                        sum(octet_length(c.data)) OVER (
                            PARTITION BY coalesce(c.start_byte, v_head) < v_head
                            ORDER BY c.seq) - octet_length(c.data) AS before,
                        sum(octet_length(c.data)) OVER (
                            PARTITION BY coalesce(c.start_byte, v_head) < v_head
                            ORDER BY c.seq DESC) AS kept
                 FROM fleetq.job_output c
                 WHERE c.job_id = p_job AND c.lease_version = p_version) k
           WHERE CASE WHEN k.head THEN k.before >= v_head ELSE k.kept > v_keep END) d
    WHERE o.job_id = p_job AND o.lease_version = p_version AND o.seq = d.seq;
    PERFORM pg_notify('fleetq_output', p_job::text);
    RETURN v_keep;
END;
$function$;

-- The same for runners from before chunks said where they start (migration 0032).
CREATE OR REPLACE FUNCTION fleetq.append_output(p_runner text, p_job bigint, p_version bigint, p_seq integer, p_data bytea)
 RETURNS void
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT FROM fleetq.append_output(p_runner, p_job, p_version, p_seq, NULL::bigint, p_data)
$function$;
