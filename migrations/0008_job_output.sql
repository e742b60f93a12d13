-- Job output in the database (issue 14), so `fleetq logs JOB --follow` works from any
-- machine, not only on the runner's node where the log file is.
--
-- The runner ships a command job's output as it runs, in chunks of at most 64 KiB, each
-- numbered within its (job, token). Bytes are stored raw, as the job wrote them (escape
-- sequences included); whoever displays them escapes them. Per (job, token) only the
-- newest `output_keep_kib` (default 1024) are kept: older chunks are dropped, so a job
-- printing without end costs bounded space, and the tail, which says how it ended, stays.
-- A cancelled or self-fenced run keeps what it had shipped. A NOTIFY on fleetq_output
-- (the job id only) wakes followers.

INSERT INTO fleetq.settings (name, value) VALUES ('output_keep_kib', '1024')
ON CONFLICT (name) DO NOTHING;

CREATE TABLE fleetq.job_output (
    job_id         bigint NOT NULL REFERENCES fleetq.jobs (id),
    lease_version  bigint NOT NULL,
    seq            integer NOT NULL CHECK (seq >= 0),
    at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    data           bytea NOT NULL CHECK (octet_length(data) <= 65536),
    PRIMARY KEY (job_id, lease_version, seq)
);

-- Append one chunk of a run's output. Only the runner that claimed that (job, token)
-- may; the lease may have moved on since (a cancelled or fenced run's last words are
-- kept). A retried chunk (lost reply) is written once.
CREATE FUNCTION fleetq.append_output(
    p_runner text, p_job bigint, p_version bigint, p_seq integer, p_data bytea
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_runner text := fleetq.acting_runner(p_runner);
    v_keep bigint := coalesce(fleetq.setting_int('output_keep_kib'), 1024)::bigint * 1024;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM fleetq.events e
                   WHERE e.job_id = p_job AND e.kind = 'claimed' AND e.lease_version = p_version
                     AND e.runner_id = v_runner)
    THEN
        RAISE EXCEPTION 'runner % never claimed job % under token %', v_runner, p_job,
                        p_version
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO fleetq.job_output (job_id, lease_version, seq, data)
    VALUES (p_job, p_version, p_seq, p_data)
    ON CONFLICT (job_id, lease_version, seq) DO NOTHING;
    -- keep the newest chunks whose sizes add up to at most output_keep_kib
    DELETE FROM fleetq.job_output o
    WHERE o.job_id = p_job AND o.lease_version = p_version
      AND o.seq < (SELECT coalesce(min(k.seq), 0) FROM (
                       SELECT seq, sum(octet_length(data)) OVER (ORDER BY seq DESC) AS kept
                       FROM fleetq.job_output
                       WHERE job_id = p_job AND lease_version = p_version) k
                   WHERE k.kept <= v_keep);
    PERFORM pg_notify('fleetq_output', p_job::text);
END;
$$;

CREATE OR REPLACE FUNCTION fleetq.secure() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    o record;
    f text;
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
    -- every client checks the schema version first
    GRANT SELECT ON fleetq.schema_migrations TO fleetq_runner, fleetq_submitter,
                                               fleetq_operator, fleetq_reader;
    -- readers (console --readonly, stats, overlaps) read everything; operators too
    GRANT SELECT ON ALL TABLES IN SCHEMA fleetq TO fleetq_reader, fleetq_operator;
    REVOKE SELECT ON fleetq.logins FROM fleetq_reader;
    -- a submitter reads jobs and results (`fleetq jobs`, `fleetq result`)
    GRANT SELECT ON fleetq.jobs, fleetq.results, fleetq.events, fleetq.identities,
                    fleetq.projects, fleetq.operations, fleetq.job_output TO fleetq_submitter;
    FOREACH f IN ARRAY ARRAY[
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
        'runner_note(text, bigint, text, bigint, jsonb)',
        'append_output(text, bigint, bigint, integer, bytea)'] LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION fleetq.%s TO fleetq_runner', f);
    END LOOP;
    FOREACH f IN ARRAY ARRAY[
        'submit(text, text, text, text, text, text, text, jsonb)', 'cancel(bigint, text, text)']
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION fleetq.%s TO fleetq_submitter, fleetq_operator',
                       f);
    END LOOP;
    GRANT EXECUTE ON FUNCTION fleetq.set_runner_state(text, text, text, text),
                              fleetq.runner_operations() TO fleetq_operator;
    GRANT EXECUTE ON FUNCTION fleetq.runner_operations(), fleetq.runner_timing()
        TO fleetq_reader, fleetq_operator, fleetq_submitter;
    -- helpers views and readers call inside their queries
    GRANT EXECUTE ON FUNCTION fleetq.setting_int(text), fleetq.setting_seconds(text),
                              fleetq.runner_is_stale(timestamptz), fleetq.ineligibility(
                                  text[], text, integer, integer, text, text[], text, boolean,
                                  integer, integer, integer, integer),
                              fleetq.eligible(text[], text, integer, integer, text, text[],
                                              text, boolean, integer, integer, integer, integer)
        TO fleetq_reader, fleetq_operator, fleetq_submitter;
END;
$$;

SELECT fleetq.secure();
