-- 0027_job_rules_compiled_once: the fifteen CHECK constraints of fleetq.jobs become one,
-- a call of a plpgsql function that holds the same rules (issue 18).
--
-- fleetq: expand
--
-- PostgreSQL rebuilds a table's CHECK constraints from their catalog text for every
-- statement that writes the table (ExecRelCheck: stringToNode and an expression's set-up
-- per constraint, per statement), and fleetq.jobs is written by every submit, claim,
-- start and outcome: fifteen constraints, rebuilt three or four times for each job that
-- flows through. Merging their texts into one constraint saved nothing (the sixth round
-- of issue 18: the cost follows the text). A plpgsql function is compiled once per
-- session, so the one constraint left is a short call, rebuilt per statement, and the
-- rules are the function's body, evaluated per row. scripts/call_costs.py --against (the
-- old form on a second scratch database, calls alternating), the server's CPU per job in
-- a runner's outcome-and-claim cycle: the old form cost 13-16% more at one job a call,
-- 5-12% at 8, 3-7% at 32, and 4-7% more per submit (docs/performance.md, ninth round).
-- The price is per row: the call adds 0.5-0.9 us to each row's check (the rules cost
-- 4.5 us a row inline, 5.2 as the call, mostly their two regular expressions), so the
-- gain shrinks as a statement carries more rows; at 256 jobs a call, and for a bulk
-- submit of thousands, it is within a few percent either way.
--
-- Expand: the rules are the old constraints' own, and a row that breaks one is refused
-- as before, with SQLSTATE 23514 (check_violation) and the old constraint's name as the
-- error's constraint name, so older code reads the same error.
-- What changes is that the rules live in a function: changing one is a migration that
-- replaces the function and re-validates the rows (a CREATE OR REPLACE alone would not
-- re-check what is stored), which is why it is here and not among the protocol files.
-- The constraint is added NOT VALID, which reads no row: every stored row kept the same
-- rules under the old constraints until they were dropped, in this transaction, and new
-- writes are checked from here on. Validating it here would read fleetq.jobs whole under
-- this ALTER TABLE's lock, which stops every submit and claim meanwhile (about four
-- seconds per million jobs on a two-CPU machine); migration 0028 validates it under a
-- lock that lets them go on.
--
-- The body names built-in operators and functions unqualified, and plpgsql resolves
-- them under the search_path of each call (the old constraints had theirs resolved when
-- they were made). Every fleetq entry point pins its own to pg_catalog, a login cannot
-- write the table otherwise, and pg_temp is never searched for an operator; what is left
-- is an administrator who puts a schema of their own ahead of pg_catalog, and who could
-- drop the constraint as well. Qualifying every operator (OPERATOR(pg_catalog.>=)) would
-- close that at the cost of reading the rules; a SET clause on the function would cost
-- a setting's save and restore per row.
--
-- The function is fleetq_owner's from the start: the protocol's writers run as that role,
-- and where the migrating role's default privileges withhold EXECUTE from PUBLIC, a
-- function of its own would refuse them until fleetq.secure() ran, at the end of the run.
--
-- Dropping the constraints takes ACCESS EXCLUSIVE on fleetq.jobs for an instant; a lock
-- that does not come within 5 s fails the migration (run it again) rather than queueing
-- every submit and claim behind it (as migration 0024).

SET LOCAL lock_timeout = '5s';

CREATE FUNCTION fleetq.jobs_row_ok(attempts smallint, state text, lease_owner text,
                                   lease_expires_at timestamptz, reserved_on text,
                                   finished_at timestamptz, commit_sha text, cpu_millis integer,
                                   idempotency_key text, lease_version bigint,
                                   memory_mb integer, priority_class smallint,
                                   promotions smallint, retry_at timestamptz,
                                   timeout_s integer, traceparent text)
 RETURNS boolean
 LANGUAGE plpgsql
 IMMUTABLE PARALLEL SAFE
AS $function$
DECLARE
    -- The first rule the row breaks, by its old constraint's name; NULL: none. A rule
    -- that evaluates to NULL holds, as a CHECK's does.
    v_broken text := CASE
        -- in the order PostgreSQL checked them (by name), so a row that broke several
        -- names the same one as before
        WHEN (attempts >= 1) IS FALSE THEN 'jobs_attempts_check'
        -- a live lease is exactly the rows with an owner and an expiry
        WHEN ((state IN ('claimed', 'running'))
              = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)) IS FALSE
            THEN 'jobs_check'
        -- a live lease holds its runner's capacity
        WHEN (state NOT IN ('claimed', 'running') OR reserved_on = lease_owner) IS FALSE
            THEN 'jobs_check1'
        WHEN ((state IN ('succeeded', 'failed', 'cancelled', 'refused'))
              = (finished_at IS NOT NULL)) IS FALSE THEN 'jobs_check2'
        WHEN (commit_sha ~ '^[0-9a-f]{40}$') IS FALSE THEN 'jobs_commit_sha_check'
        WHEN (cpu_millis >= 0) IS FALSE THEN 'jobs_cpu_millis_check'
        WHEN (length(idempotency_key) BETWEEN 1 AND 256) IS FALSE
            THEN 'jobs_idempotency_key_check'
        WHEN (lease_version >= 0) IS FALSE THEN 'jobs_lease_version_check'
        WHEN (memory_mb >= 0) IS FALSE THEN 'jobs_memory_mb_check'
        WHEN (priority_class IN (0, 1, 2)) IS FALSE THEN 'jobs_priority_class_check'
        WHEN (promotions BETWEEN 0 AND 2) IS FALSE THEN 'jobs_promotions_check'
        WHEN (retry_at IS NULL OR state = 'waiting') IS FALSE THEN 'jobs_retry_waits'
        WHEN (state IN ('waiting', 'queued', 'claimed', 'running', 'succeeded', 'failed',
                        'cancelled', 'refused')) IS FALSE THEN 'jobs_state_check'
        WHEN (timeout_s > 0) IS FALSE THEN 'jobs_timeout_s_check'
        WHEN (traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$') IS FALSE
            THEN 'jobs_traceparent_check'
    END;
BEGIN
    IF v_broken IS NULL THEN
        RETURN true;
    END IF;
    RAISE EXCEPTION 'new row for relation "jobs" violates check constraint "%"', v_broken
        USING ERRCODE = 'check_violation', SCHEMA = 'fleetq', TABLE = 'jobs',
              CONSTRAINT = v_broken;
END;
$function$;
ALTER FUNCTION fleetq.jobs_row_ok(smallint, text, text, timestamptz, text, timestamptz, text,
                                  integer, text, bigint, integer, smallint, smallint,
                                  timestamptz, integer, text) OWNER TO fleetq_owner;

ALTER TABLE fleetq.jobs
    DROP CONSTRAINT jobs_state_check,
    DROP CONSTRAINT jobs_check,
    DROP CONSTRAINT jobs_check1,
    DROP CONSTRAINT jobs_check2,
    DROP CONSTRAINT jobs_retry_waits,
    DROP CONSTRAINT jobs_commit_sha_check,
    DROP CONSTRAINT jobs_memory_mb_check,
    DROP CONSTRAINT jobs_cpu_millis_check,
    DROP CONSTRAINT jobs_timeout_s_check,
    DROP CONSTRAINT jobs_idempotency_key_check,
    DROP CONSTRAINT jobs_priority_class_check,
    DROP CONSTRAINT jobs_lease_version_check,
    DROP CONSTRAINT jobs_promotions_check,
    DROP CONSTRAINT jobs_attempts_check,
    DROP CONSTRAINT jobs_traceparent_check,
    ADD CONSTRAINT jobs_rules CHECK (fleetq.jobs_row_ok(
        attempts, state, lease_owner, lease_expires_at, reserved_on, finished_at, commit_sha,
        cpu_millis, idempotency_key, lease_version, memory_mb, priority_class, promotions,
        retry_at, timeout_s, traceparent)) NOT VALID;
